// myapp:demo/workflow.batch: func(count: u32) -> result<string, string>
//
// Child workflows: runs the `parallel` workflow `count` times at once and sums what they
// return. Child workflows are awaited (not cancelled) when the join set closes.
import { parallelSubmit, parallelAwaitNext } from "myapp:demo-obelisk-ext/workflow";
import * as obelisk from "obelisk:workflow@1.0.0";

export default function batch(count) {
  const js = obelisk.createJoinSet();
  for (let i = 0; i < count; i++) parallelSubmit(js);
  let total = 0;
  for (let i = 0; i < count; i++) total += Number(parallelAwaitNext(js));
  return String(total);
}
