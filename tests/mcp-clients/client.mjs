// Drives a carmy server over MCP with the official TypeScript client (@modelcontextprotocol/client).
//
// Usage: node client.mjs MODE URL, where MODE is `auto` (probes `server/discover`, then speaks
// 2026-07-28) or `legacy` (the 2025-11-25 `initialize` handshake with `Mcp-Session-Id`). Exits
// non-zero, naming the check, on the first failure.
import { randomUUID } from 'node:crypto';
import { Client, ProtocolError, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const REQUEST_ID = 'dev.carmy/request_id';
const [mode, url] = process.argv.slice(2);
// Give up rather than hang the test that runs this script.
setTimeout(() => {
  console.error('FAILED: timed out after 60 s');
  process.exit(1);
}, 60_000).unref();

function check(condition, what) {
  if (!condition) {
    console.error(`FAILED: ${what}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

const client = new Client(
  { name: 'carmy-ci', version: '1.0.0' },
  { versionNegotiation: { mode } },
);
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const version = client.getNegotiatedProtocolVersion();
check(version === (mode === 'legacy' ? '2025-11-25' : '2026-07-28'), `negotiated ${version}`);

const { tools } = await client.listTools();
const names = tools.map((tool) => tool.name);
check(JSON.stringify(names) === JSON.stringify([...names].sort()), `tools in a stable (name) order: ${names}`);
const byName = Object.fromEntries(tools.map((tool) => [tool.name, tool]));
const create = byName.create_order;
check(create.inputSchema.type === 'object' && 'sku' in create.inputSchema.properties, 'create_order has its input schema');
check('order_id' in create.outputSchema.properties, 'create_order has its output schema');
check(create.title === 'Create order', 'create_order has a title');
check(
  create.annotations.readOnlyHint === false && create.annotations.idempotentHint === false
    && create.annotations.destructiveHint === false && create.annotations.openWorldHint === false,
  'create_order annotations: a non-idempotent write',
);
check(byName.get_order.annotations.readOnlyHint === true, 'get_order is read-only');
check(byName.cancel_order.annotations.destructiveHint === true, 'cancel_order is destructive');
check(byName.cancel_order._meta['dev.carmy/tool'].confirmation === 'required', 'carmy metadata under _meta');

const read = await client.callTool({ name: 'list_products', arguments: {} });
check(!read.isError && read.structuredContent.products.some((p) => p.sku === 'KB-01'), 'list_products returns structured content');

const requestId = `order-${randomUUID()}`;
const first = await client.callTool({ name: 'create_order', arguments: { sku: 'KB-01' }, _meta: { [REQUEST_ID]: requestId } });
const again = await client.callTool({ name: 'create_order', arguments: { sku: 'KB-01' }, _meta: { [REQUEST_ID]: requestId } });
check(!first.isError && again.structuredContent.order_id === first.structuredContent.order_id, 'the retry returns the same order');
check(again._meta['dev.carmy/replayed'] === true, 'the retry is a replay');
const orderId = first.structuredContent.order_id;
const fetched = await client.callTool({ name: 'get_order', arguments: { order_id: orderId } });
check(fetched.structuredContent.quantity === 1, 'one order was placed');

const progress = [];
const report = await client.callTool(
  { name: 'generate_report', arguments: { seconds: 1 } },
  { onprogress: (update) => progress.push(update) },
);
check(!report.isError && report.structuredContent.seconds === 1, 'generate_report completes');
check(JSON.stringify(progress.map((p) => p.progress)) === '[1,2,3,4]', `progress 1..4 received: ${JSON.stringify(progress)}`);
check(progress[0].total === 4 && progress[0].message === 'step 1 of 4', 'progress carries total and message');

const bad = await client.callTool({ name: 'create_order', arguments: { sku: 42 } });
const error = bad._meta['dev.carmy/error'];
check(bad.isError && bad.structuredContent === undefined, 'a bad call is an error result without structured content');
check(error.code === 'INVALID_ARGUMENTS' && error.category === 'validation' && error.retryable === false, 'the carmy error is under _meta');
check(JSON.stringify(JSON.parse(bad.content[0].text)) === JSON.stringify(error), 'and is the text');

const refused = await client.callTool({ name: 'cancel_order', arguments: { order_id: orderId } });
check(refused.isError && refused._meta['dev.carmy/error'].code === 'CONFIRMATION_REQUIRED', 'cancel_order without confirmation is refused');
const still = await client.callTool({ name: 'get_order', arguments: { order_id: orderId } });
check(still.structuredContent.status === 'placed', 'and the order stands');

try {
  await client.callTool({ name: 'no_such_tool', arguments: {} });
  check(false, 'an unknown tool is a protocol error');
} catch (unknown) {
  check(unknown instanceof ProtocolError && unknown.code === -32602, `an unknown tool is a protocol error (${unknown.message})`);
}

await client.close();
