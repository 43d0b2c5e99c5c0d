// myapp:demo/workflow.fanout: func(n: u32) -> result<string, string>
//
// Fan-out / fan-in: `n` children in one join set, each sleeping a random time (a
// persisted random value, so a replay makes the same choices), awaited in completion
// order. `obelisk.ChildExecutionError` carries a failed child's err value.
import { stepSubmit, stepAwaitNext } from "myapp:demo-obelisk-ext/activity";
import * as obelisk from "obelisk:workflow@1.0.0";

export default function fanout(n) {
  const js = obelisk.createJoinSet({ name: "fan" });
  for (let i = 0; i < n; i++) {
    stepSubmit(js, i, obelisk.randomU64(50, 1500));
  }
  const order = [];
  for (let i = 0; i < n; i++) {
    order.push(Number(stepAwaitNext(js)));
  }
  console.log(`completion order: ${order.join(", ")}`);
  return String(order.reduce((a, b) => a + b, 0));
}
