// Drive the gasless MCP server with the MCP Inspector's CLI, many invocations in one Node process, and write
// what each one saw to a JSON report.
//
//   node inspector_cli.mjs <plan.json> <report.json> <url>                 streamable HTTP (a host's /mcp)
//   node inspector_cli.mjs <plan.json> <report.json> <command> [args...]   stdio (e.g. gasless mcp --api URL)
//
// Each step is one invocation of `mcp-inspector --cli <target> --method <method> ... --format json --output
// <file>`, run through the CLI's own entry point, `runCli`, which the `mcp-inspector --cli` launcher calls
// in-process as well: Node and the Inspector load once per transport instead of once per call, and each
// invocation still connects (over stdio: starts the server), lists, calls and disconnects on its own.
// <plan.json>: {"concurrency": n, "stages": [[step, ...], ...]}, a step being {"label", "method"} with
// "tool" and "arguments" (tools/call, passed verbatim with --tool-args-json) or "uri" (resources/read).
// The stages run one after the other, the steps of a stage `concurrency` at a time. Per step, the report
// holds the result the CLI wrote and its exit status: 0, or the `exitCode` of what the CLI threw (5 for a
// tool error), with that error's code and message (`exitCode` null: an error the CLI did not classify),
// and how long it took (`ms`).

import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [planFile, reportFile, ...target] = process.argv.slice(2);
if (!planFile || !reportFile || target.length === 0) {
  console.error("usage: node inspector_cli.mjs PLAN.json REPORT.json URL | COMMAND [ARGS...]");
  process.exit(2);
}
const plan = JSON.parse(readFileSync(planFile, "utf8"));
const inspector = new URL("./node_modules/@modelcontextprotocol/inspector/", import.meta.url);
const { runCli } = await import(new URL("clients/cli/build/index.js", inspector));
const version = JSON.parse(readFileSync(new URL("package.json", inspector), "utf8")).version;
const scratch = mkdtempSync(join(tmpdir(), "inspector-cli-"));

function argv(step, output) {
  const args = [...target, "--method", step.method, "--format", "json", "--output", output];
  if (step.method === "tools/call") {
    args.push("--tool-name", step.tool, "--tool-args-json", JSON.stringify(step.arguments));
  } else if (step.uri !== undefined) {
    args.push("--uri", step.uri);
  }
  return [process.execPath, "mcp-inspector", ...args];
}

async function run(step, index) {
  const output = join(scratch, `${index}.json`);
  const seen = { ...step, exitCode: 0 };
  const started = performance.now();
  try {
    await runCli(argv(step, output));
  } catch (error) {
    seen.exitCode = Number.isInteger(error?.exitCode) ? error.exitCode : null;
    seen.error = { code: error?.envelope?.code ?? null, message: String(error?.message ?? error) };
  }
  seen.ms = Math.round(performance.now() - started);
  try {
    seen.result = JSON.parse(readFileSync(output, "utf8"));
  } catch {
    seen.result = null; // nothing written: the CLI failed before it had a result
  }
  return seen;
}

const report = { inspector: version, steps: [] };
let index = 0;
try {
  for (const stage of plan.stages) {
    const queue = stage.map((step) => [step, index++]);
    const seen = new Array(queue.length);
    const first = queue.length ? queue[0][1] : 0;
    const worker = async () => {
      for (let next = queue.shift(); next !== undefined; next = queue.shift()) {
        seen[next[1] - first] = await run(...next);
      }
    };
    await Promise.all(Array.from({ length: Math.max(1, plan.concurrency ?? 1) }, worker));
    report.steps.push(...seen);
  }
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
writeFileSync(reportFile, JSON.stringify(report) + "\n");
