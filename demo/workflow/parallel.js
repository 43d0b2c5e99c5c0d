// myapp:demo/workflow.parallel: func() -> result<string, string>
import { stepSubmit, stepAwaitNext } from "myapp:demo-obelisk-ext/activity";
import * as obelisk from "obelisk:workflow@1.0.0";

export default function parallel() {
  const js = obelisk.createJoinSet();
  for (let i = 0; i < 10; i++) {
    stepSubmit(js, i, 200); // does not block
  }
  let acc = 0;
  for (let i = 0; i < 10; i++) {
    acc += Number(stepAwaitNext(js)); // in completion order
  }
  return String(acc);
}
