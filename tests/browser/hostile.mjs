// The console under hostile rows and at 3 a.m., in headless Chromium: one check (at least) per
// defect of the console review (docs/operations.md, "The web console"). scripts/console-browser.sh
// sets the scene (tests/browser/hostile.sql: every kind of hostile row, 1,200+ failed messages,
// a key with 40 messages behind its failed head, a `payments` route whose sink is down, a relay
// whose webhook answers 422 echoing the row) and passes it in the environment:
//   BASE (the console, with TOKEN), OPEN_BASE (a console on loopback without a token), SHOTS,
//   RELAY_PID (killed near the end), LINK_BASE (another site, serving link.html with a link to
//   the console), OUTBOX_BIN, DATABASE_URL, SCHEMA.
import { execFileSync } from "node:child_process";
import { mkdirSync } from "node:fs";
import { chromium } from "playwright-core";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this through scripts/console-browser.sh`);
  return v;
};
const [BASE, OPEN_BASE, TOKEN, SHOTS, LINK_BASE] = ["BASE", "OPEN_BASE", "TOKEN", "SHOTS", "LINK_BASE"].map(env);
const RELAY_PID = Number(env("RELAY_PID"));
mkdirSync(SHOTS, { recursive: true });
const port = new URL(BASE).port;

let failures = 0;
const check = (ok, what) => {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failures += 1;
};
const status = () =>
  JSON.parse(
    execFileSync(env("OUTBOX_BIN"), ["status", "--format", "json", "--database-url", env("DATABASE_URL"), "--schema", env("SCHEMA")], {
      encoding: "utf8",
    }),
  );
const figure = async (page, name) => (await page.locator(`[data-figure="${name}"]`).first().innerText()).split("\n")[0].trim();
// The whole page, and its first screen (what is seen first, and readable when the whole is
// very tall).
const shot = async (page, name) => {
  const path = `${SHOTS}/${name}.png`;
  await page.screenshot({ path, fullPage: true });
  await page.screenshot({ path: `${SHOTS}/${name}-top.png` });
  console.log(`     screenshot ${path}`);
};
// Whether the page fits its viewport: nothing wider than the window, so no row's columns are
// pushed off-screen (a table may scroll inside its own box).
const fits = async (page) =>
  page.evaluate(() => ({ width: document.documentElement.scrollWidth, window: window.innerWidth }));
const noScriptRan = async (page, what) => {
  const n = await page.evaluate(() => ({
    scripts: document.querySelectorAll("script").length,
    handlers: [...document.querySelectorAll("*")].filter((e) => [...e.attributes].some((a) => a.name.startsWith("on"))).length,
    jsLinks: [...document.querySelectorAll("[href],[src]")].filter((e) => /^\s*(javascript|data):/i.test(e.getAttribute("href") || e.getAttribute("src") || "")).length,
  }));
  check(n.scripts === 0 && n.handlers === 0 && n.jsLinks === 0, `${what}: no script, no on* attribute, no javascript: link ${JSON.stringify(n)}`);
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  // evil.example resolves to this machine: a DNS-rebinding page reaches the console by its name.
  args: ["--no-sandbox", "--host-resolver-rules=MAP evil.example 127.0.0.1"],
});
let dialogs = 0;
// Each section checks one defect; an exception in one (an element the page lacks) is counted as
// a failure and the next section runs, so one run reports every defect.
const section = async (name, run) => {
  try {
    await run();
  } catch (e) {
    check(false, `${name}: ${String(e.message || e).split("\n")[0]}`);
  }
};
let head = null;
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  context.on("page", (p) => p.on("dialog", async (d) => { dialogs += 1; await d.dismiss(); }));
  const page = await context.newPage();
  page.setDefaultTimeout(5000);
  page.on("dialog", async (d) => { dialogs += 1; await d.dismiss(); });
  await page.goto(`${BASE}/?token=${encodeURIComponent(TOKEN)}`);

  await section("the first question: a route's sink down", async () => {
    // The first question: a route's sink is down, named though the console was given no routes.
    await page.goto(`${BASE}/`);
    const banner = await page.locator("#flow").innerText();
    check(banner.includes("The sink of route `payments` is down"), `the overview's first line names the stuck route: ${banner.split("\n")[0]}`);
    check((await page.locator("#routes-unknown").count()) === 1, "it says why the backlog cannot be grouped by route here");
    const types = await page.locator("#types").innerText();
    check(/payment \/ payment\.created\s+30/.test(types), "the backlog by type names payment.created with its 30 messages");
    const [pending, flowing, held] = [await figure(page, "pending"), await figure(page, "pending_flowing"), await figure(page, "pending_blocked")];
    check(Number(flowing) + Number(held) === Number(pending) && Number(held) >= 40, `pending ${pending} is split: ${flowing} can flow, ${held} held`);
    const s = status();
    const named = (h) => h.split(" (circuit")[0];
    check(s.flow.state === "sink_down" && banner.includes(named(s.flow.headline)), `outbox status answers the same: ${s.flow.headline}`);
    await noScriptRan(page, "overview");
    await shot(page, "hostile-overview");
  });

  await section("wrong answers at scale", async () => {
    // Wrong answers at scale: every failed message counted, the newest found, a typo refused.
    await page.goto(`${BASE}/failed`);
    const s = status();
    const total = Number(await figure(page, "failed_shown"));
    check(total === s.failed && total >= 1216, `the failed list counts all ${s.failed} failed messages (${total})`);
    let size = await fits(page);
    check(size.width <= size.window, `the failed list fits 1400 px with a 100 KB key on it (${size.width} px)`);
    check(!(await page.content()).includes("?key=long-key"), "no link by a 100 KB key (it answered 414)");
    const listText = await page.locator("#failed").innerText();
    check(listText.includes("user⟨U+202E⟩gnp.exe") && !listText.includes("\u202e"), "the right-to-left override is shown by name, not obeyed");
    check(listText.includes("ansi⟨ESC⟩[2J"), "the terminal escape is shown by name");
    await noScriptRan(page, "failed list");
    await shot(page, "hostile-failed");
    await page.goto(`${BASE}/failed?key=bulk-1200`);
    check((await figure(page, "failed_shown")) === "1", "the newest failed key is found (it showed 0 of the oldest 1,000)");
    await page.goto(`${BASE}/redrive?key=bulk-1200`);
    check((await figure(page, "redrive_count")) === "1", "and its redrive preview has it");
    await page.goto(`${BASE}/redrive`);
    check((await page.locator("#redrive-more").innerText()).includes(`${total.toLocaleString("en")} failed messages match`), "a redrive of everything says what one form carries and what is left");
    const firstId = await page.locator("#redrive a").first().innerText();
    const typo = await page.goto(`${BASE}/redrive?id=${firstId.slice(0, -1)}`);
    check(typo.status() === 400 && (await page.locator("#redrive-form").count()) === 0, `an id one character short is refused (${typo.status()}), never "redrive all"`);
    await shot(page, "hostile-redrive-typo");
  });

  await section("narrow screens", async () => {
    // Narrow screens: the overview and the failed list scroll inside their tables, never sideways.
    const phone = await browser.newContext({ viewport: { width: 390, height: 844 } });
    const small = await phone.newPage();
    await small.goto(`${BASE}/failed?token=${encodeURIComponent(TOKEN)}`);
    let size = await fits(small);
    check(size.width <= size.window, `the failed list fits 390 px (${size.width} px)`);
    await shot(small, "hostile-failed-390");
    await small.goto(`${BASE}/`);
    size = await fits(small);
    check(size.width <= size.window, `the overview fits 390 px (${size.width} px)`);
    await shot(small, "hostile-overview-390");
    await phone.close();
  });

  await section("hostile text in a journey", async () => {
    // Hostile text in a journey: the RLO message's summary keeps the console's words in order.
    await page.goto(`${BASE}/failed?key=${encodeURIComponent("user\u202egnp.exe")}`);
    await page.locator("#failed td a[href^='/messages?id=']").first().click();
    const summary = await page.locator("section.journey p").first().innerText();
    check(/ — now failed$/.test(summary) && !summary.includes("\u202e"), `the journey's summary reads in order: ${summary}`);
    let size = await fits(page);
    check(size.width <= size.window, `the journey fits (${size.width} px)`);
    await noScriptRan(page, "journey");
    await shot(page, "hostile-journey-rlo");
    // The 100 KB key's journey: shown whole, wrapped.
    await page.goto(`${BASE}/failed?type=order%2Fplaced`);
    const longRow = page.locator("#failed tr", { hasText: "long-key-LLL" }).first();
    await longRow.locator("a", { hasText: "whole key" }).click();
    size = await fits(page);
    check((await page.locator("h3", { hasText: "The whole key" }).count()) === 1 && size.width <= size.window, `the 100 KB key is a click away, wrapped (${size.width} px)`);
    await shot(page, "hostile-journey-long-key");
  });

  await section("a key's head", async () => {
    // A key with 40 messages behind its head: the head first, the waiting ones link to it.
    await page.goto(`${BASE}/messages?key=order-007`);
    head = await page.locator("section.journey").first().getAttribute("data-message");
    const first = head;
    const firstState = await page.locator("section.journey [data-figure=state]").first().innerText();
    check(firstState === "failed", `the key's failed head comes first (${first}, ${firstState})`);
    check((await page.locator("#key-count").innerText()).includes("of more than 20"), "it says the key has more than it shows");
    await shot(page, "hostile-key-head");
    await page.locator("a.held-by").first().click();
    check((await page.locator("section.journey").first().getAttribute("data-message")) === first, "a waiting message links to the head that holds it");
  });

  await section("redrive from the journey", async () => {
    // Redrive from the journey; the head fails again (the receiver still answers 422) and its
    // journey's last failure carries its own time, after the redrive.
    await page.locator("a.redrive").first().click();
    await page.locator("textarea[name=reason]").fill("trying again after the receiver's fix");
    await page.locator("input[name=who]").fill("on-call");
    await page.locator("#redrive-form button[type=submit]").click();
    check(new URL(page.url()).pathname === "/redrive/done" && (await figure(page, "redriven")) === "1", "the redrive answers with its result page");
    await page.reload();
    check((await figure(page, "redriven")) === "1", "reloading the result shows it again and redrives nothing");
    await shot(page, "hostile-redrive-done");
    let times = null;
    for (let i = 0; i < 60; i++) {
      await page.goto(`${BASE}/messages?id=${head}`);
      if ((await figure(page, "state")) === "failed" && (await page.locator("ol.timeline li.redriven").count()) > 0) {
        times = await page.evaluate(() => {
          const at = (sel) => [...document.querySelectorAll(sel)].map((li) => li.querySelector("time")?.getAttribute("datetime")).filter(Boolean);
          return { redriven: at("ol.timeline li.redriven"), failed: at("ol.timeline li.failed") };
        });
        break;
      }
      await page.waitForTimeout(500);
    }
    const lastFailed = times && times.failed[times.failed.length - 1];
    const redriven = times && times.redriven[times.redriven.length - 1];
    check(times && lastFailed && redriven && Date.parse(lastFailed) >= Date.parse(redriven), `after the redrive the journey's last failure is later than the redrive (${redriven} → ${lastFailed})`);
    check((await page.locator("ol.timeline").first().innerText()).includes("(console by on-call, from 127.0.0.1)"), "the audit keeps who redrove, and from where");
    await shot(page, "hostile-journey-failed-again");
  });

  await section("a followed link", async () => {
    // A link followed from another site (chat, a pager) opens the page: the reading cookie is Lax.
    const other = await context.newPage();
    await other.goto(`${LINK_BASE}/link.html`);
    const [followed] = await Promise.all([other.waitForNavigation(), other.locator("a#console").click()]);
    check(followed.status() === 200 && (await other.locator("h1").innerText()).includes("Failed"), `a console link followed from another site opens the page (${followed.status()})`);
    await shot(other, "hostile-followed-link");
    await other.close();
  });

  await section("DNS rebinding", async () => {
    // DNS rebinding: a page of evil.example, once its name points at this machine, reaches the
    // console without a token on loopback (the docs' first example) under its own name; it is
    // refused before anything is read, and so is the console with a token.
    const rebound = await browser.newPage();
    for (const [base, what] of [[OPEN_BASE, "without a token"], [BASE, "with a token"]]) {
      const at = `http://evil.example:${new URL(base).port}`;
      const refused = await rebound.goto(`${at}/failed?key=bulk-0001`);
      const said = await rebound.locator("body").innerText();
      check(refused.status() === 403 && said.includes("--allowed-host") && !said.includes("bulk-0001"), `a foreign Host is refused before anything is read, console ${what} (${refused.status()})`);
      if (base === OPEN_BASE) await shot(rebound, "hostile-rebinding-refused");
    }
    const direct = await rebound.goto(`${OPEN_BASE}/failed?key=bulk-0001`);
    check(direct.status() === 200, `the same console by its own address answers (${direct.status()})`);
    await rebound.close();
  });

  await section("refresh", async () => {
    // A refresh that needs no script.
    await page.goto(`${BASE}/`);
    await page.locator(".bar a", { hasText: "10 s" }).click();
    check((await page.locator("meta[http-equiv=refresh]").getAttribute("content")) === "10", "auto-refresh every 10 s, without script");
  });

  await section("the relay killed", async () => {
    // At 3 a.m. the only relay dies: the overview says so first, within 30 seconds.
    process.kill(RELAY_PID, "SIGKILL");
    const killed = Date.now();
    let state = "";
    while (Date.now() - killed < 30000) {
      await page.goto(`${BASE}/`);
      state = (await figure(page, "flow_state")).toLowerCase();
      if (state === "no relay") break;
      await page.waitForTimeout(1000);
    }
    const took = ((Date.now() - killed) / 1000).toFixed(1);
    check(state === "no relay", `${took} s after kill -9 of the only relay the overview's first line says: ${(await page.locator("#flow").innerText()).split("\n")[0]}`);
    await page.goto(`${BASE}/`);
    await shot(page, "hostile-overview-relay-killed");
  });

  await section("sign-out", async () => {
    // Sign out: the session is refused from then on.
    await page.locator("header form button", { hasText: "Sign out" }).click();
    const after = await page.goto(`${BASE}/`);
    check(after.status() === 401, `signed out, the console asks for its token again (${after.status()})`);
  });
  check(dialogs === 0, `no dialog opened on any page (${dialogs})`);
} finally {
  await browser.close();
}
if (failures > 0) {
  console.error(`console-browser (hostile): ${failures} check(s) failed`);
  process.exit(1);
}
console.log("console-browser (hostile): every check passed");
