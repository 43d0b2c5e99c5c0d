// myapp:demo/workflow.order-cancellable: func(order: string) -> result<string, string>
//
// Waits for a person: `approve` is an `activity_stub`, finished from outside with
// `obelisk execution stub <child id> '{"ok": true}'` (or from the console). The function
// name ends in `-cancellable`, so the workflow itself can be cancelled while it waits:
// its open join sets are torn down from the log (the approval child is cancelled).
import { approve } from "myapp:demo/approval";
import { step } from "myapp:demo/activity";

export default function order(orderId) {
  console.log(`order ${orderId}: waiting for approval`);
  let approved;
  try {
    approved = approve(orderId);
  } catch (e) {
    if (e instanceof obelisk.ChildExecutionError) {
      throw `order ${orderId}: approval failed: ${JSON.stringify(e.value)}`;
    }
    throw e;
  }
  if (!approved) return `order ${orderId} rejected`;
  step(1, 300);
  step(2, 300);
  return `order ${orderId} shipped`;
}
