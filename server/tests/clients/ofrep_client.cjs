// An OpenFeature program in Node reading Levee flags through @openfeature/ofrep-provider
// (server-sdk). Used by server/tests/e2e/ofrep.rs: argv[2] is the provider's base URL,
// OFREP_TOKEN (optional) a flags token. Each line on stdin is `KEY DEFAULT` (a bool flag
// and the caller's default); each answer is one JSON line {value, reason, errorCode}.
// Modules come from NODE_PATH (target/ofrep-node/node_modules, installed by .ci/run).
'use strict';
const { OpenFeature } = require('@openfeature/server-sdk');
const { OFREPProvider } = require('@openfeature/ofrep-provider');
const readline = require('node:readline');

async function main() {
  const baseUrl = process.argv[2];
  const token = process.env.OFREP_TOKEN;
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  await OpenFeature.setProviderAndWait(new OFREPProvider({ baseUrl, headers }));
  const client = OpenFeature.getClient();
  console.log(JSON.stringify({ ready: true }));
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const [key, fallback] = line.trim().split(/\s+/);
    const d = await client.getBooleanDetails(key, fallback === 'true');
    console.log(JSON.stringify({ value: d.value, reason: d.reason, errorCode: d.errorCode ?? null }));
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
