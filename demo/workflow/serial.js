// myapp:demo/workflow.serial: func() -> result<string, string>
import { step } from "myapp:demo/activity";

export default function serial() {
  let acc = 0;
  for (let i = 0; i < 10; i++) {
    // Pauses the workflow, submits the activity and waits for its result.
    acc += Number(step(i, 200));
  }
  return String(acc);
}
