"""Produces CloudEvents with the official CloudEvents Python SDK (`cloudevents`), for the inbox
to ingest: each event laid out by the SDK's own binding for the broker.

stdin: {"binding": "kafka|amqp|mqtt|nats", "mode": "binary|structured", "events": [{"id",
"source", "type", "subject", "data"}]}. stdout: [{"headers": [[name, value]], "key": str|null,
"body_b64": str}], which the test publishes as they are.

Kafka and AMQP use the SDK's Kafka and AMQP bindings; NATS the HTTP binding's layout (what the
NATS binary mode is); MQTT and every structured message without a binding the SDK's JSON event
format (`application/cloudevents+json`).
"""

import base64
import datetime
import json
import sys

from cloudevents.core.bindings import amqp, http, kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

FMT = JSONFormat()


def text(v):
    if isinstance(v, (bytes, bytearray)):
        return v.decode()
    if isinstance(v, datetime.datetime):
        return v.isoformat()
    return str(v)


def write(binding, mode, ev):
    if binding == "kafka":
        m = (kafka.to_binary if mode == "binary" else kafka.to_structured)(ev, FMT)
        key = m.key.decode() if isinstance(m.key, (bytes, bytearray)) else m.key
        return [[k, text(v)] for k, v in m.headers.items()], key, m.value
    if binding == "amqp":
        m = (amqp.to_binary if mode == "binary" else amqp.to_structured)(ev, FMT)
        headers = [[k, text(v)] for k, v in m.application_properties.items()]
        if "content-type" in m.properties:
            headers.append(["content-type", m.properties["content-type"]])
        return headers, None, m.application_data
    if binding == "nats" and mode == "binary":
        m = http.to_binary(ev, FMT)
        return [[k, text(v)] for k, v in m.headers.items()], None, m.body
    if binding in ("nats", "mqtt", "json"):
        return [], None, FMT.write(ev)
    raise SystemExit(f"unknown binding {binding}")


def main():
    req = json.load(sys.stdin)
    out = []
    for e in req["events"]:
        attrs = {
            "id": e["id"],
            "source": e["source"],
            "type": e["type"],
            "subject": e["subject"],
            "time": datetime.datetime.now(datetime.timezone.utc),
            "datacontenttype": "application/json",
        }
        ev = CloudEvent(attrs, e["data"])
        headers, key, body = write(req["binding"], req["mode"], ev)
        out.append({"headers": headers, "key": key,
                    "body_b64": base64.b64encode(body).decode()})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
