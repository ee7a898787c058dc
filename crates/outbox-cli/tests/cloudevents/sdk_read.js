// Reads what a broker delivered with the official CloudEvents JavaScript SDK (`cloudevents` on
// npm, installed in /opt/outbox-node by scripts/services.sh): the same input and output as
// sdk_read.py. Any message the SDK refuses (or whose event fails its `validate()`) fails the
// run with the SDK's own error.
//
// The SDK has bindings for HTTP, Kafka and MQTT; NATS binary mode is the HTTP binding's layout,
// read by it. It has none for AMQP: there its `CloudEvent` class (which validates every
// attribute) is given the `cloudEvents:` application properties, or the structured body.
// The HTTP binding of this SDK version does not percent-decode header values (the
// specification's 3.1.3.2 says a receiver must): `undecoded` lists the attributes it returned
// still encoded, decoded here so the test still compares every attribute with its row.
"use strict";
const path = require("path");
const ce = require(path.join(process.env.OUTBOX_NODE || "/opt/outbox-node", "node_modules", "cloudevents"));
const { HTTP, Kafka, MQTT, CloudEvent } = ce;

function read(binding, headers, key, body) {
  const h = Object.fromEntries(headers);
  const ct = headers.find(([k]) => k.toLowerCase() === "content-type")?.[1];
  const structured = !!ct && ct.toLowerCase().startsWith("application/cloudevents");
  switch (binding) {
    case "redis":
      // The `ce_` entries of the headers field, read by the Kafka binding (no record key).
      return Kafka.toEvent({ headers: h, key: undefined, value: body, body });
    case "sqs":
    case "sns":
      // `ce-` message attributes, read by the HTTP binding.
      return HTTP.toEvent({ headers: h, body });
    case "kafka":
      return Kafka.toEvent({ headers: h, key, value: body, body });
    case "http":
    case "nats":
      return HTTP.toEvent({ headers: h, body });
    case "mqtt": {
      const props = Object.fromEntries(headers.filter(([k]) => k.toLowerCase() !== "content-type"));
      return MQTT.toEvent({ PUBLISH: { "Content Type": ct }, headers: props, body });
    }
    case "amqp": {
      if (structured) return new CloudEvent(JSON.parse(body));
      const attrs = {};
      for (const [k, v] of headers) {
        if (k.startsWith("cloudEvents:")) attrs[k.slice("cloudEvents:".length)] = v;
      }
      return new CloudEvent({ ...attrs, datacontenttype: ct, data: JSON.parse(body) });
    }
    default:
      throw new Error(`unknown binding ${binding}`);
  }
}

let input = "";
process.stdin.on("data", (c) => (input += c));
process.stdin.on("end", () => {
  const req = JSON.parse(input);
  const out = [];
  for (const m of req.messages) {
    const body = Buffer.from(m.body_b64, "base64").toString("utf8");
    const ev = read(req.binding, m.headers, m.key, body);
    ev.validate();
    const attributes = {};
    const undecoded = [];
    for (const [k, v] of Object.entries(ev)) {
      if (k === "data" || k === "data_base64" || v === undefined) continue;
      let value = v instanceof Date ? v.toISOString() : v;
      if (["http", "nats", "sqs", "sns"].includes(req.binding) && typeof value === "string" && /%[0-9A-Fa-f]{2}/.test(value)) {
        undecoded.push(k);
        value = decodeURIComponent(value);
      }
      attributes[k] = value;
    }
    let data = ev.data;
    if (typeof data === "string") data = JSON.parse(data);
    if (Buffer.isBuffer(data)) data = JSON.parse(data.toString("utf8"));
    out.push({ attributes, data, undecoded });
  }
  process.stdout.write(JSON.stringify(out));
});
