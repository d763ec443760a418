// An ACP client built on the official TypeScript SDK (@agentclientprotocol/sdk, the version
// in tests/support/acp_sdk_pins.txt), for tests/test_acp_sdk_clients_e2e.py: it runs a plan of
// steps against the bridge's ACP gateway and prints a JSON report on stdout.
//
//   node acp_sdk_client.mjs PLAN.json
//
// The plan: {"sdk": "<the SDK's package dir>", "transport": {...}, "steps": [...]}.
//   transport {"kind": "ws", "url": "ws://…/v1/acp/NAME", "token": "…"}  the gateway itself
//             {"kind": "stdio", "command": [argv…], "env": {…}}           `agent-bridge acp`
//   steps     see STEPS below; every string "$name" in a step's params is replaced by the
//             value a previous step saved as name ("save": {"name": "dotted.path"}).
//
// The point is the SDK's strictness: the SDK parses every request and notification the
// gateway sends with its schema before a handler sees it, and this script checks the rest
// (each response against the schema of the request it answers, and every incoming message
// again, raw, in case the SDK dropped one quietly). Anything that does not fit goes into
// the report's "problems", which the tests require to be empty.
//
// Exit status 0 when the plan ran to its end (problems or not), 2 when a step threw
// (the report is still printed, with "failed").

import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
const load = (rel) => import(pathToFileURL(path.join(plan.sdk, rel)).href);
const acp = await load("dist/v1/stable/acp.js");
const { createWebSocketStream } = await load("dist/transports/ws-stream.js");
// The SDK's own zod schemas (the ones it parses incoming messages with), for what it
// does not check itself: the results of the requests this client makes.
const z = await load("dist/v1/schema/zod.gen.js");

const RESPONSES = {
  initialize: z.zInitializeResponse,
  "session/new": z.zNewSessionResponse,
  "session/load": z.zLoadSessionResponse,
  "session/resume": z.zResumeSessionResponse,
  "session/list": z.zListSessionsResponse,
  "session/prompt": z.zPromptResponse,
  "session/set_mode": z.zSetSessionModeResponse,
  "session/set_config_option": z.zSetSessionConfigOptionResponse,
  "session/close": z.zCloseSessionResponse,
  "session/delete": z.zDeleteSessionResponse,
};
const INCOMING = {
  "session/update": z.zSessionNotification,
  "session/request_permission": z.zRequestPermissionRequest,
  "elicitation/create": z.zCreateElicitationRequest,
  "elicitation/complete": z.zCompleteElicitationNotification,
  "$/cancel_request": z.zCancelRequestNotification,
};

const report = { results: [], received: [], problems: [], asks: [], elicitations: [] };
const vars = {};
const STEP_MS = plan.stepTimeoutMs ?? 30000;

function problem(text) {
  report.problems.push(text);
}

function check(schema, value, what) {
  const parsed = schema.safeParse(value);
  if (!parsed.success) problem(`${what} does not fit the schema: ${JSON.stringify(value)}: ${parsed.error.message}`);
}

// ------------------------------------------------------------------ the observed stream
// The transport's stream with both directions watched: what this client sent (to know
// which method a response answers) and every message received, checked raw.
const outgoing = []; // every request this client sent, in order: {id, method}

function observed(stream) {
  const sent = new Map();
  const readable = stream.readable.pipeThrough(
    new TransformStream({
      transform(msg, controller) {
        report.received.push(msg);
        for (const wake of [...wakers]) wake();
        if (msg.jsonrpc !== "2.0") problem(`not JSON-RPC 2.0: ${JSON.stringify(msg)}`);
        if ("method" in msg) {
          const schema = INCOMING[msg.method];
          if (!schema) problem(`a method this client does not know: ${JSON.stringify(msg)}`);
          else check(schema, msg.params, msg.method);
        } else if ("error" in msg) {
          const e = msg.error;
          if (typeof e?.code !== "number" || typeof e?.message !== "string") problem(`a bad error: ${JSON.stringify(msg)}`);
        } else {
          const method = sent.get(msg.id);
          if (method === undefined) problem(`a response to no request of ours: ${JSON.stringify(msg)}`);
          else if (RESPONSES[method]) check(RESPONSES[method], msg.result, `the answer to ${method}`);
        }
        controller.enqueue(msg);
      },
    }),
  );
  const writer = stream.writable.getWriter();
  const writable = new WritableStream({
    write(msg) {
      if ("method" in msg && "id" in msg) {
        sent.set(msg.id, msg.method);
        outgoing.push({ id: msg.id, method: msg.method });
      }
      return writer.write(msg);
    },
    close() {
      return writer.close();
    },
    abort(reason) {
      return writer.abort(reason);
    },
  });
  return { readable, writable };
}

let child = null;
const wakers = new Set();

// Resolves once pred() holds, checked again at each message received.
function arrival(pred) {
  return new Promise((resolve) => {
    const wake = () => {
      if (pred()) {
        wakers.delete(wake);
        resolve();
      }
    };
    wakers.add(wake);
    wake();
  });
}

async function open() {
  const t = plan.transport;
  if (t.kind === "ws") {
    // Node's WebSocket sends no custom headers: the token goes as a subprotocol, the way
    // the gateway accepts it from browsers.
    const stream = createWebSocketStream(t.url, { protocols: ["agent-bridge.v1", `bearer.${t.token}`] });
    return observed(stream);
  }
  child = spawn(t.command[0], t.command.slice(1), {
    env: { ...process.env, ...(t.env ?? {}) },
    stdio: ["pipe", "pipe", "inherit"],
  });
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  return observed(stream);
}

// ------------------------------------------------------------------ the client's handlers
// What the current step says to answer a permission request or an elicitation with.
let policy = { permission: "allow", elicitation: "decline" };
const waiting = []; // answers held back ("never"): released at the end

function permissionAnswer(params) {
  report.asks.push(params);
  const want = policy.permission;
  if (want === "never") return new Promise((resolve) => waiting.push(() => resolve({ outcome: { outcome: "cancelled" } })));
  if (want === "cancel") return { outcome: { outcome: "cancelled" } };
  const kind = want === "allow" ? "allow_once" : "reject_once";
  const option = params.options.find((o) => o.kind === kind) ?? params.options[0];
  return { outcome: { outcome: "selected", optionId: option.optionId } };
}

function elicitationAnswer(params) {
  report.elicitations.push(params);
  const want = policy.elicitation;
  if (want === "never") return new Promise((resolve) => waiting.push(() => resolve({ action: "cancel" })));
  if (want === "decline" || want === "cancel") return { action: want };
  return { action: "accept", content: want };
}

const app = acp
  .client({ name: "agent-bridge-tests" })
  .onRequest("session/request_permission", ({ params }) => permissionAnswer(params))
  .onRequest("elicitation/create", ({ params }) => elicitationAnswer(params))
  .onNotification("session/update", () => {})
  .onNotification("elicitation/complete", () => {});

// ------------------------------------------------------------------ the steps
function substitute(value) {
  if (typeof value === "string" && value.startsWith("$")) {
    if (!(value.slice(1) in vars)) throw new Error(`no saved value ${value}`);
    return vars[value.slice(1)];
  }
  if (Array.isArray(value)) return value.map(substitute);
  if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, substitute(v)]));
  return value;
}

function dig(value, dotted) {
  return dotted.split(".").reduce((v, k) => (v == null ? undefined : v[k]), value);
}

function withDeadline(promise, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer in ${STEP_MS} ms`)), STEP_MS);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

const STEPS = {
  // {"op": "request", "method": M, "params": P}: one request, answered or refused.
  async request(conn, step) {
    try {
      return { result: await withDeadline(conn.agent.request(step.method, substitute(step.params ?? {})), step.method) };
    } catch (err) {
      if (err instanceof acp.RequestError) return { error: { code: err.code, message: err.message, data: err.data } };
      throw err;
    }
  },
  // {"op": "notify", "method": M, "params": P}
  async notify(conn, step) {
    await conn.agent.notify(step.method, substitute(step.params ?? {}));
    return {};
  },
  // {"op": "start", "id": "p1", "method": M, "params": P}: a request left running (a
  // prompt to cancel); {"op": "finish", "id": "p1"} waits for its answer.
  async start(conn, step) {
    const at = outgoing.length; // the request below is the first one sent from here
    const running = conn.agent.request(step.method, substitute(step.params ?? {}));
    running.catch(() => {});
    started.set(step.id, running);
    sentAt.set(step.id, at);
    return {};
  },
  // {"op": "cancel_request", "id": "p1"}: $/cancel_request for a started request.
  async cancel_request(conn, step) {
    const request = outgoing[sentAt.get(step.id)];
    await conn.agent.notify("$/cancel_request", { requestId: request.id });
    return {};
  },
  async finish(conn, step) {
    return settle(started.get(step.id), step.id);
  },
  // {"op": "until", "count": N, "kind": K}: wait until N session/update of that kind came
  async until(conn, step) {
    const seen = () => report.received.filter((m) => m.method === "session/update" && m.params.update.sessionUpdate === step.kind);
    await withDeadline(arrival(() => seen().length >= step.count), `${step.count} ${step.kind}`);
    return {};
  },
  // {"op": "reconnect"}: this connection closes and a new one opens (a new editor).
  async reconnect() {
    return { reconnect: true };
  },
};
const started = new Map();
const sentAt = new Map(); // a started request's index in outgoing

async function settle(promise, what) {
  try {
    return { result: await withDeadline(promise, what) };
  } catch (err) {
    if (err instanceof acp.RequestError) return { error: { code: err.code, message: err.message, data: err.data } };
    throw err;
  }
}

async function connectOnce() {
  const stream = await open();
  return app.connect(stream);
}

async function main() {
  let conn = await connectOnce();
  for (const step of plan.steps) {
    policy = { ...policy, ...(step.answer ?? {}) };
    const from = report.received.length;
    let out;
    if (step.op === "reconnect") {
      conn.close();
      if (child) {
        child.stdin.end();
        await new Promise((r) => child.once("exit", r));
      }
      conn = await connectOnce();
      out = {};
    } else {
      out = await STEPS[step.op](conn, step);
    }
    // What came while the step ran: the session/update of a prompt's turn or a load's replay.
    out.updates = report.received
      .slice(from)
      .filter((m) => m.method === "session/update")
      .map((m) => m.params);
    for (const [name, dotted] of Object.entries(step.save ?? {})) vars[name] = dig(out, dotted);
    report.results.push(out);
  }
  for (const release of waiting) release();
  conn.close();
  if (child) {
    child.stdin.end();
    await new Promise((r) => child.once("exit", r));
  }
}

let status = 0;
try {
  await main();
} catch (err) {
  report.failed = String(err?.stack ?? err);
  status = 2;
}
// Exit once the report is written: stdout to a pipe is asynchronous, and exiting at once
// could cut a long report short.
process.stdout.write(JSON.stringify(report) + "\n", () => process.exit(status));
