-- The hostile fixture of scripts/console-browser.sh (its second scene): every kind of row the
-- console review probed with, a key with 40 messages behind its head, a route whose sink is
-- down, and 1,200 messages that fail. `{schema}` is replaced by the script. Written by plain
-- SQL, as any application may write rows.
INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers, topic)
VALUES
  -- Markup in every field.
  ('order', '<script>alert(1)</script>', '<script>alert(2)</script>',
   '{"x": "<script>alert(3)</script>"}', '{"x-h": "<script>alert(4)</script>"}', NULL),
  ('order', '"><img src=x onerror=alert(1)>', '"><img src=x onerror=alert(2)>',
   '{"x": "\"><img src=x onerror=alert(3)>"}', '{"x-h": "\"><img src=x onerror=alert(4)>"}', NULL),
  ('order', '"><svg onload=alert(1)>', '"><svg onload=alert(2)>',
   '{"x": "\"><svg onload=alert(3)>"}', '{"x-h": "\"><svg onload=alert(4)>"}', NULL),
  -- A javascript: topic and header value; a header name that is markup; headers that are no
  -- object.
  ('order', 'js-topic', 'placed', '{}', '{"x-link": "javascript:alert(1)"}', 'javascript:alert(1)'),
  ('order', 'hdr-name', 'placed', '{}', '{"<img src=x onerror=alert(1)>": "v"}', NULL),
  ('order', 'hdr-array', 'placed', '{}', '[]', NULL),
  -- 100 KB key, type and payload; a 400-character unbroken key.
  ('order', 'long-key-' || repeat('L', 100000), 'placed', '{}', '{}', NULL),
  ('order', 'long-type', 'placed-' || repeat('T', 100000), '{}', '{}', NULL),
  ('order', 'long-payload', 'placed', json_build_object('blob', repeat('P', 100000)), '{}', NULL),
  ('order', repeat('K', 400), 'placed', '{}', '{}', NULL),
  -- A right-to-left override in key and type; text that only looks like a NUL; a terminal
  -- escape; SQL-ish text; a key that looks like a query string; zalgo, emoji and CJK.
  ('order', E'user\u202Egnp.exe', E'pla\u202Eced', '{}', '{}', NULL),
  ('order', 'nul-\u0000-\x00-%00', 'placed', '{}', '{}', NULL),
  ('order', E'ansi\x1b[2J\x1b[31mRED\x1b[0m', 'placed', '{}', '{}', NULL),
  ('order', $$'; DROP TABLE outbox; --$$, $$placed' OR '1'='1$$, '{}', '{}', NULL),
  ('order', 'amp&id=01a249c1-7a2f-7fec-819c-10b3090de091#frag', 'placed', '{}', '{}', NULL),
  ('order', 'Z̷̢̛a̶͓l̸g̵o̴ 🙂 漢字キー', '注文.作成', '{"t": "漢字 🙂"}', '{}', NULL);

-- order-007: its head fails, and 40 messages wait behind it.
INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'order-007', 'order.placed', json_build_object('n', i)
FROM generate_series(0, 40) AS i;

-- The payments route's sink is down: these wait, its circuit open.
INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'payment', 'pay-' || i, 'payment.created', json_build_object('n', i)
FROM generate_series(1, 30) AS i;

-- 1,200 messages that fail.
INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'bulk', 'bulk-' || lpad(i::text, 4, '0'), 'bulk.failed', json_build_object('n', i)
FROM generate_series(1, 1200) AS i;
