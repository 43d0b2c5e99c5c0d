// myapp:demo/greeter.flaky: func(fail-percent: u32) -> result<u32, string>
// Fails (and is retried with backoff) fail-percent % of the time: shows retries in the demo.
export default function flaky(failPercent) {
  const roll = Math.floor(Math.random() * 100);
  if (roll < failPercent) {
    throw new Error(`unlucky roll ${roll} < ${failPercent}`);
  }
  return roll;
}
