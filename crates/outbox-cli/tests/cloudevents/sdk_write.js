// Produces CloudEvents with the official CloudEvents JavaScript SDK (npm `cloudevents`), for
// the inbox to ingest: the same input and output as sdk_write.py. Kafka, MQTT (binary mode
// included: user properties) and NATS (the HTTP binding's layout) use the SDK's bindings; the
// SDK has none for AMQP, Redis or SQS, which get its structured JSON event (`toJSON`).
"use strict";
const path = require("path");
const ce = require(path.join(process.env.OUTBOX_NODE || "/opt/outbox-node", "node_modules", "cloudevents"));
const { HTTP, Kafka, MQTT, CloudEvent } = ce;

// The SDK writes an unset attribute as the header value "undefined": left out.
const pairs = (h) => Object.entries(h).filter(([, v]) => v !== undefined).map(([k, v]) => [k, String(v)]);
const text = (b) => (b === undefined || b === null ? "" : typeof b === "string" ? b : JSON.stringify(b));

function write(binding, mode, ev) {
  const binary = mode === "binary";
  switch (binding) {
    case "kafka": {
      const m = binary ? Kafka.binary(ev) : Kafka.structured(ev);
      return { headers: pairs(m.headers), key: m.key ?? null, body: text(m.value) };
    }
    case "mqtt": {
      const m = binary ? MQTT.binary(ev) : MQTT.structured(ev);
      const headers = pairs(m.headers);
      headers.push(["content-type", m.PUBLISH["Content Type"]]);
      return { headers, key: null, body: text(m.body) };
    }
    case "nats": {
      const m = binary ? HTTP.binary(ev) : HTTP.structured(ev);
      // Structured NATS carries no headers: the body says it is an event.
      const headers = binary ? pairs(m.headers) : [];
      return { headers, key: null, body: text(m.body) };
    }
    default:
      return { headers: [], key: null, body: JSON.stringify(ev.toJSON()) };
  }
}

let input = "";
process.stdin.on("data", (c) => (input += c));
process.stdin.on("end", () => {
  const req = JSON.parse(input);
  const out = req.events.map((e) => {
    const ev = new CloudEvent({
      id: e.id, source: e.source, type: e.type, subject: e.subject,
      datacontenttype: "application/json", data: e.data,
    });
    const m = write(req.binding, req.mode, ev);
    return { headers: m.headers, key: m.key, body_b64: Buffer.from(m.body, "utf8").toString("base64") };
  });
  process.stdout.write(JSON.stringify(out));
});
