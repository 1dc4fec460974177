// Reads [{"body": "...", "headers": {...}}, ...] on stdin and verifies each
// with the standardwebhooks package; prints one line per request: "ok" and
// the parsed data.version, or the error.
import { Webhook } from "standardwebhooks";

const secret = process.argv[2];
let input = "";
for await (const chunk of process.stdin) input += chunk;
const wh = new Webhook(secret);
for (const req of JSON.parse(input)) {
  try {
    const ev = wh.verify(req.body, req.headers);
    console.log("ok", ev.type, ev.data.user_id, ev.data.version);
  } catch (e) {
    console.log("fail", String(e && e.message ? e.message : e));
  }
}
