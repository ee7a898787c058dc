"""Reads what a broker delivered with the official CloudEvents Python SDK (`cloudevents`).

stdin: {"binding": "kafka|http|amqp|mqtt|nats", "messages": [{"headers": [[name, value]],
"key": str|null, "body_b64": str}]}. stdout: one JSON object per message with every attribute
the SDK read (`time` in ISO 8601, `data` as JSON). Any message the SDK refuses fails the run
with the SDK's own error: a conformant receiver must reject nothing the relay sends.

The SDK has bindings for Kafka, HTTP and AMQP; NATS binary mode is the HTTP binding's layout
(`ce-` headers, percent-encoded values), read by it; MQTT binary mode (user properties named
after the attributes) and every structured message without a binding are read by the SDK's
JSON event format and its v1.0 event class, which validate every attribute.
"""

import base64
import json
import sys

from cloudevents.core.bindings import amqp, http, kafka
from cloudevents.core.bindings.common import decode_header_value
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

FMT = JSONFormat()
ATTRIBUTES = ("specversion", "id", "source", "type", "subject", "time", "datacontenttype",
              "dataschema", "traceparent", "tracestate", "partitionkey")


def read(binding, headers, key, body):
    ct = next((v for k, v in headers if k.lower() == "content-type"), None)
    structured = ct is not None and ct.lower().startswith("application/cloudevents")
    if binding == "redis":
        # The `ce_` entries of the headers field, read by the Kafka binding (no record key).
        binding, key = "kafka", None
    if binding in ("sqs", "sns"):
        # `ce-` message attributes, read by the HTTP binding.
        binding = "http"
    if binding == "kafka":
        msg = kafka.KafkaMessage(headers={k: v.encode() for k, v in headers}, key=key, value=body)
        return kafka.from_kafka(msg, FMT)
    if binding in ("http", "nats"):
        return http.from_http(http.HTTPMessage(headers=dict(headers), body=body), FMT)
    if binding == "amqp":
        props = {"content-type": ct} if ct else {}
        msg = amqp.AMQPMessage(properties=props, application_properties=dict(headers),
                               application_data=body)
        return amqp.from_amqp(msg, FMT)
    if binding == "mqtt":
        if structured or ct is None:
            return FMT.read(CloudEvent, body)
        # The SDK's own decoding of a header value (`time` to a datetime).
        attrs = {k: decode_header_value(k, v) for k, v in headers if k in ATTRIBUTES}
        attrs["datacontenttype"] = ct
        return CloudEvent(attrs, FMT.read_data(body, ct))
    raise SystemExit(f"unknown binding {binding}")


def main():
    req = json.load(sys.stdin)
    out = []
    for m in req["messages"]:
        body = base64.b64decode(m["body_b64"])
        ev = read(req["binding"], [tuple(h) for h in m["headers"]], m.get("key"), body)
        attrs = {}
        for name, value in ev.get_attributes().items():
            attrs[name] = value.isoformat() if hasattr(value, "isoformat") else value
        data = ev.get_data()
        if isinstance(data, (bytes, bytearray)):
            data = json.loads(data)
        out.append({"attributes": attrs, "data": data})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
