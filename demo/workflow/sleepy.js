// myapp:demo/workflow.sleepy: func(rounds: u32, seconds: u32) -> result<string, string>
//
// Persistent sleep: each `obelisk.sleep` writes a timer to the log and the workflow is
// woken when it expires, even if the server was restarted in between. `Date.now()` is
// deterministic: it replays the recorded time.
import { step } from "myapp:demo/activity";
import * as obelisk from "obelisk:workflow@1.0.0";

export default function sleepy(rounds, seconds) {
  const started = Date.now();
  for (let i = 0; i < rounds; i++) {
    const woke = obelisk.sleep({ seconds });
    console.log(`round ${i}: woke at ${woke.toISOString()}`);
    step(i, 50);
  }
  return `slept ${rounds} × ${seconds} s, ${Math.round((Date.now() - started) / 1000)} s in all`;
}
