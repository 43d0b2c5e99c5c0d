// myapp:demo/greeter.greet: func(name: string) -> result<string, string>
export default function greet(name) {
  if (name.trim() === "") {
    throw new Error("name must not be empty");
  }
  console.log(`greeting ${name}`);
  return `Hello, ${name}!`;
}
