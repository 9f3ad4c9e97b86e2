// The baseline this project replaces: a JavaScript entry script that relays ACP line by line
// (readline + write), as a plugin's agent/entry.mjs would. Usage: node node_forwarder.js CMD [ARGS...]
const { spawn } = require("node:child_process");
const readline = require("node:readline");

const child = spawn(process.argv[2], process.argv.slice(3), { stdio: ["pipe", "pipe", "inherit"] });
readline.createInterface({ input: process.stdin }).on("line", (line) => child.stdin.write(line + "\n"));
process.stdin.on("end", () => child.stdin.end());
readline.createInterface({ input: child.stdout }).on("line", (line) => process.stdout.write(line + "\n"));
child.on("exit", (code) => process.exit(code ?? 1));
