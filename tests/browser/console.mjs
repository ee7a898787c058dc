// `outbox console` in headless Chromium, as an on-call engineer uses it: every page against
// `outbox status --format json`, a screenshot of each, a redrive clicked with a reason that makes
// the failed message flow, that message's journey, and the refusals (no token, a cross-site
// form). scripts/console-browser.sh sets the scene and passes it in the environment:
//   BASE, TOKEN, SHOTS (screenshot directory), FLAG (touched when the receiver may accept),
//   FAILED_ID (the failed message), OUTBOX_BIN, DATABASE_URL, SCHEMA.
import { execFileSync } from "node:child_process";
import { writeFileSync, mkdirSync } from "node:fs";
import { chromium } from "playwright-core";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this through scripts/console-browser.sh`);
  return v;
};
const [BASE, TOKEN, SHOTS, FLAG, FAILED_ID] = ["BASE", "TOKEN", "SHOTS", "FLAG", "FAILED_ID"].map(env);
mkdirSync(SHOTS, { recursive: true });

let failures = 0;
const check = (ok, what) => {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failures += 1;
};
const status = (...extra) =>
  JSON.parse(
    execFileSync(env("OUTBOX_BIN"), ["status", "--format", "json", "--database-url", env("DATABASE_URL"), "--schema", env("SCHEMA"), ...extra], {
      encoding: "utf8",
    }),
  );
const figure = async (page, name) => (await page.locator(`[data-figure="${name}"]`).first().innerText()).split("\n")[0].trim();
const shot = async (page, name) => {
  const path = `${SHOTS}/${name}.png`;
  await page.screenshot({ path, fullPage: true });
  console.log(`     screenshot ${path}`);
};
// The page and `outbox status` read at slightly different moments: compare up to 5 times.
const sameFigures = async (page, path, names, report) => {
  let last = "";
  for (let i = 0; i < 5; i++) {
    await page.goto(`${BASE}${path}`);
    const json = report();
    const got = {};
    const want = {};
    for (const [name, pick] of names) {
      got[name] = await figure(page, name);
      want[name] = String(pick(json));
    }
    last = `page ${JSON.stringify(got)} status ${JSON.stringify(want)}`;
    if (JSON.stringify(got) === JSON.stringify(want)) return [true, last];
    await page.waitForTimeout(500);
  }
  return [false, last];
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox"],
});
try {
  // Refused without the token.
  const stranger = await browser.newPage();
  const refused = await stranger.goto(`${BASE}/`);
  check(refused.status() === 401, `a request without the token is refused (${refused.status()})`);
  check((await stranger.content()).includes("needs its token"), "the refusal says how to get in");
  await stranger.close();

  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  await page.goto(`${BASE}/?token=${encodeURIComponent(TOKEN)}`);
  check(new URL(page.url()).search === "", "the token leaves the address once the cookie is set");

  const stats = ["pending", "failed", "parked", "retrying", "blocked_keys"].map((n) => [n, (s) => s[n]]);
  let [ok, seen] = await sameFigures(page, "/", stats, () => status());
  check(ok, `overview figures equal outbox status --format json: ${seen}`);
  check((await page.locator("svg.chart").count()) === 3, "the overview draws its three charts");
  check((await page.locator("script").count()) === 0, "no script on the page");
  await shot(page, "overview");

  [ok, seen] = await sameFigures(page, "/partitions", [["partitions_owned", (s) => s.partitions.filter((p) => p.owner !== null).length]], () => status());
  check(ok, `partitions owned equal status: ${seen}`);
  check((await page.locator("#partitions tbody tr").count()) === status().partitions.length, "one row per partition");
  await shot(page, "partitions");

  [ok, seen] = await sameFigures(page, "/retention", [["segments", (s) => s.retention.segments]], () => status());
  check(ok, `retention segments equal status: ${seen}`);
  await shot(page, "retention");

  [ok, seen] = await sameFigures(page, "/inbox", stats, () => status("--inbox"));
  check(ok, `inbox figures equal outbox status --inbox --format json: ${seen}`);
  await shot(page, "inbox");

  await page.goto(`${BASE}/failed`);
  check((await figure(page, "failed_shown")) === "1", "the failed message is listed");
  check((await page.content()).includes(FAILED_ID), "with its id");
  await shot(page, "failed");

  // The receiver accepts from now on; redrive the failed row with a reason.
  writeFileSync(FLAG, "accept\n");
  await page.locator("#failed a.redrive").first().click();
  check((await figure(page, "redrive_count")) === "1", "the preview says what the redrive will do");
  await shot(page, "redrive-preview");
  const reason = "receiver fixed: it accepts these payloads now";
  await page.locator("textarea[name=reason]").fill(reason);
  const [posted] = await Promise.all([page.waitForNavigation(), page.locator("#redrive-form button[type=submit]").click()]);
  const landed = new URL(page.url());
  check(landed.pathname === "/redrive/done", `the redrive answers with a redirect to its result (${posted?.status()} ${landed.pathname}): ${(await page.locator("body").innerText()).slice(0, 300)}`);
  check((await figure(page, "redriven")) === "1", "one message redriven");
  await shot(page, "redrive-done");

  let state = "";
  for (let i = 0; i < 60 && state !== "published"; i++) {
    await page.goto(`${BASE}/messages?id=${FAILED_ID}`);
    state = await figure(page, "state");
    if (state !== "published") await page.waitForTimeout(1000);
  }
  check(state === "published", `the redriven message flowed (state ${state})`);
  const timeline = await page.locator("ol.timeline").first().innerText();
  const order = ["written", "failed attempt(s); last error", "redriven", `${reason} (console, from 127.0.0.1)`, "published"];
  let from = 0;
  let inOrder = true;
  for (const step of order) {
    const at = timeline.indexOf(step, from);
    if (at < 0) inOrder = false;
    else from = at + step.length;
  }
  check(inOrder, `its journey shows the failed attempts, the redrive with its reason, the publication:\n${timeline}`);
  await shot(page, "journey");

  // A form on another site that posts to the console: the cookie is SameSite=Strict and the
  // request is cross-site, so it is refused and nothing is redriven.
  const evil = await context.newPage();
  await evil.setContent(
    `<form id="f" method="post" action="${BASE}/redrive"><input name="ids" value="${FAILED_ID}"><input name="reason" value="csrf"></form>`,
  );
  const [answer] = await Promise.all([evil.waitForNavigation(), evil.evaluate(() => document.getElementById("f").submit())]);
  const code = answer ? answer.status() : 0;
  check(code === 401 || code === 403, `a cross-site POST is refused (${code})`);
  await evil.close();
  const direct = await page.request.post(`${BASE}/redrive`, {
    form: { ids: FAILED_ID, reason: "csrf" },
    headers: { origin: "http://evil.example" },
  });
  check(direct.status() === 403, `a POST from another origin with the cookie is refused (${direct.status()})`);
} finally {
  await browser.close();
}
if (failures > 0) {
  console.error(`console-browser: ${failures} check(s) failed`);
  process.exit(1);
}
console.log("console-browser: every check passed");
