;; Demo activity `myapp:demo/wat` (see wit/world.wit), written by hand in WebAssembly text
;; against the component model's canonical ABI. `python -m engine.build_components` assembles
;; it and wraps it into a component with the WIT world (engine/wat_build.py); the demo
;; deployment runs the result, demo/build/activity_wat.wasm.
;;
;; Conventions (wasm-tools' `cm32p2` names): an export `cm32p2|<interface>|<function>`, the
;; memory `cm32p2_memory`, the allocator `cm32p2_realloc`. A function returning
;; `result<T, string>` returns a pointer to its return area: the discriminant byte (0 = ok,
;; 1 = err) at offset 0, then the payload (a string is a pointer and a length) aligned to the
;; largest alignment of either case: offset 4 for result<string, string>, 8 when a case is a
;; u64 (result<u64, string>).
;;
;; Memory map: 16..31 the return area; 64..79 what imports return; 256.. constant strings;
;; 4096.. the heap of cm32p2_realloc (a bump allocator: every run gets a fresh instance).
(module
  (import "cm32p2|wasi:io/streams@0.2" "[method]output-stream.blocking-write-and-flush"
    (func $write (param i32 i32 i32 i32)))
  (import "cm32p2|wasi:io/streams@0.2" "output-stream_drop" (func $drop_stream (param i32)))
  (import "cm32p2|wasi:cli/stdout@0.2" "get-stdout" (func $get_stdout (result i32)))
  (import "cm32p2|wasi:clocks/wall-clock@0.2" "now" (func $now (param i32)))
  (import "cm32p2|obelisk:log/log@1" "info" (func $log_info (param i32 i32)))
  (import "cm32p2|obelisk:log/log@1" "warn" (func $log_warn (param i32 i32)))

  (memory (export "cm32p2_memory") 1)
  (data (i32.const 256) "Hello, ")                    ;; 7 bytes
  (data (i32.const 264) "!\n")                        ;; 2 bytes
  (data (i32.const 272) "too early, will be retried") ;; 26 bytes
  (data (i32.const 304) "add: computing a + b")       ;; 20 bytes
  (data (i32.const 336) "write to stdout failed")     ;; 22 bytes

  (global $heap (mut i32) (i32.const 4096))
  (func $realloc (export "cm32p2_realloc")
        (param $old i32) (param $old_size i32) (param $align i32) (param $size i32) (result i32)
    (local $ptr i32)
    (local.set $ptr
      (i32.and
        (i32.add (global.get $heap) (i32.sub (local.get $align) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get $align))))
    (global.set $heap (i32.add (local.get $ptr) (local.get $size)))
    (block $done
      (loop $grow
        (br_if $done
          (i32.le_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536))))
        (if (i32.eq (memory.grow (i32.const 1)) (i32.const -1)) (then unreachable))
        (br $grow)))
    (if (i32.ne (local.get $old_size) (i32.const 0))
      (then (memory.copy (local.get $ptr) (local.get $old) (local.get $old_size))))
    (local.get $ptr))

  ;; ok(v) of a result<u64, string>
  (func $ok_u64 (param $v i64) (result i32)
    (i32.store8 (i32.const 16) (i32.const 0))
    (i64.store (i32.const 24) (local.get $v))
    (i32.const 16))

  ;; err(string) of a result<u64, string> (payload at offset 8)
  (func $err_u64 (param $ptr i32) (param $len i32) (result i32)
    (i32.store8 (i32.const 16) (i32.const 1))
    (i32.store (i32.const 24) (local.get $ptr))
    (i32.store (i32.const 28) (local.get $len))
    (i32.const 16))

  ;; ok(string) (tag 0) or err(string) (tag 1) of a result<string, string>
  (func $ret_str (param $tag i32) (param $ptr i32) (param $len i32) (result i32)
    (i32.store8 (i32.const 16) (local.get $tag))
    (i32.store (i32.const 20) (local.get $ptr))
    (i32.store (i32.const 24) (local.get $len))
    (i32.const 16))

  ;; wasi:clocks/wall-clock.now() in milliseconds since the Unix epoch
  (func $now_ms (result i64)
    (call $now (i32.const 64)) ;; datetime { seconds: u64 @64, nanoseconds: u32 @72 }
    (i64.add
      (i64.mul (i64.load (i32.const 64)) (i64.const 1000))
      (i64.div_u (i64.extend_i32_u (i32.load (i32.const 72))) (i64.const 1000000))))

  ;; add: func(a: u64, b: u64) -> result<u64, string>
  (func (export "cm32p2|myapp:demo/wat|add") (param $a i64) (param $b i64) (result i32)
    (call $log_info (i32.const 304) (i32.const 20))
    (call $ok_u64 (i64.add (local.get $a) (local.get $b))))

  ;; fail-until: func(unix-ms: u64) -> result<u64, string>
  (func (export "cm32p2|myapp:demo/wat|fail-until") (param $until i64) (result i32)
    (local $ms i64)
    (local.set $ms (call $now_ms))
    (if (i64.lt_u (local.get $ms) (local.get $until))
      (then
        (call $log_warn (i32.const 272) (i32.const 26))
        (return (call $err_u64 (i32.const 272) (i32.const 26)))))
    (call $ok_u64 (local.get $ms)))

  ;; greet: func(name: string) -> result<string, string>
  (func (export "cm32p2|myapp:demo/wat|greet") (param $name i32) (param $len i32) (result i32)
    (local $buf i32)
    (local $stream i32)
    ;; "Hello, " + name + "!\n" in one fresh buffer of len + 9 bytes
    (local.set $buf
      (call $realloc (i32.const 0) (i32.const 0) (i32.const 1)
                     (i32.add (local.get $len) (i32.const 9))))
    (memory.copy (local.get $buf) (i32.const 256) (i32.const 7))
    (memory.copy (i32.add (local.get $buf) (i32.const 7)) (local.get $name) (local.get $len))
    (memory.copy
      (i32.add (local.get $buf) (i32.add (local.get $len) (i32.const 7)))
      (i32.const 264) (i32.const 2))
    (local.set $stream (call $get_stdout))
    (call $write
      (local.get $stream) (local.get $buf) (i32.add (local.get $len) (i32.const 9))
      (i32.const 64))
    (call $drop_stream (local.get $stream))
    ;; result<_, stream-error>: discriminant byte at 64
    (if (i32.ne (i32.load8_u (i32.const 64)) (i32.const 0))
      (then (return (call $ret_str (i32.const 1) (i32.const 336) (i32.const 22)))))
    ;; ok("Hello, <name>!"), without the newline
    (call $ret_str (i32.const 0) (local.get $buf) (i32.add (local.get $len) (i32.const 8))))
)
