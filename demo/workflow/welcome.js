// myapp:demo/workflow.welcome: func(email: string) -> result<string, string>
//
// Scheduling: a fire-and-forget top-level execution of `send-email`, five minutes from
// now. It is not a child (no join set), so this workflow finishes without waiting for it.
import { sendEmail } from "myapp:demo/activity";
import { sendEmailSchedule } from "myapp:demo-obelisk-schedule/activity";

export default function welcome(email) {
  const messageId = sendEmail(email, "Welcome!");
  const followUp = sendEmailSchedule({ minutes: 5 }, email, "How is it going?");
  return `sent ${messageId}, follow-up scheduled as ${followUp}`;
}
