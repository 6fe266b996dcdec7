// Drive the gasless MCP server with an official TypeScript MCP client and print what it saw, as JSON.
//
//   node mcp_client.mjs <sdk> <plan.json> <url>                 streamable HTTP (a host's /mcp)
//   node mcp_client.mjs <sdk> <plan.json> <command> [args...]   stdio (e.g. gasless mcp --api URL)
//
// <sdk>: "v1" is @modelcontextprotocol/sdk (1.x: validates any structured content against the tool's
// output schema, errors included), "v2" is @modelcontextprotocol/client (2.x). <plan.json> lists the tool
// calls ({label, tool, arguments}) and the resources (URIs) to read, in order. Every call's outcome is
// recorded, including what the client itself throws (an output schema mismatch is thrown by the SDK, not
// answered by the server); the process exits 0 whenever it could connect and list.

import { readFileSync } from "node:fs";

const [sdk, planFile, ...target] = process.argv.slice(2);
if (!["v1", "v2"].includes(sdk) || !planFile || target.length === 0) {
  console.error("usage: node mcp_client.mjs v1|v2 PLAN.json URL | COMMAND [ARGS...]");
  process.exit(2);
}
const plan = JSON.parse(readFileSync(planFile, "utf8"));

let Client, HttpTransport, StdioTransport, version;
if (sdk === "v1") {
  ({ Client } = await import("@modelcontextprotocol/sdk/client/index.js"));
  ({ StreamableHTTPClientTransport: HttpTransport } = await import(
    "@modelcontextprotocol/sdk/client/streamableHttp.js"
  ));
  ({ StdioClientTransport: StdioTransport } = await import("@modelcontextprotocol/sdk/client/stdio.js"));
  version = JSON.parse(readFileSync(new URL("./node_modules/@modelcontextprotocol/sdk/package.json", import.meta.url)))
    .version;
} else {
  ({ Client, StreamableHTTPClientTransport: HttpTransport } = await import("@modelcontextprotocol/client"));
  ({ StdioClientTransport: StdioTransport } = await import("@modelcontextprotocol/client/stdio"));
  version = JSON.parse(
    readFileSync(new URL("./node_modules/@modelcontextprotocol/client/package.json", import.meta.url)),
  ).version;
}

const http = /^https?:\/\//.test(target[0]);
const transport = http
  ? new HttpTransport(new URL(target[0]))
  : new StdioTransport({ command: target[0], args: target.slice(1), env: process.env, stderr: "inherit" });

function thrown(error) {
  return { name: error?.name ?? typeof error, code: error?.code ?? null, message: String(error?.message ?? error) };
}

const client = new Client({ name: "gasless-tests", version: "1.0.0" });
const transportErrors = [];
client.onerror = (error) => transportErrors.push(thrown(error));
await client.connect(transport);

const out = {
  sdk: { package: sdk === "v1" ? "@modelcontextprotocol/sdk" : "@modelcontextprotocol/client", version },
  transport: http ? "http" : "stdio",
  server: client.getServerVersion(),
  tools: (await client.listTools()).tools,
  resources: (await client.listResources()).resources.map((resource) => resource.uri),
  calls: [],
  reads: [],
  transportErrors,
};
for (const call of plan.calls ?? []) {
  try {
    out.calls.push({ ...call, result: await client.callTool({ name: call.tool, arguments: call.arguments }) });
  } catch (error) {
    out.calls.push({ ...call, thrown: thrown(error) });
  }
}
for (const uri of plan.resources ?? []) {
  try {
    const read = await client.readResource({ uri });
    out.reads.push({ uri, contents: read.contents });
  } catch (error) {
    out.reads.push({ uri, thrown: { ...thrown(error), data: error?.data ?? null } });
  }
}
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
