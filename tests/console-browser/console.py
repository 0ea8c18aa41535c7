"""The console in a real browser: Playwright for Python driving Debian's chromium.

    console.py BASE_URL SCREENSHOT_DIR SHAPES_URL

BASE_URL serves the shop example with its demo tokens, SHAPES_URL an app whose one tool,
`ship`, takes every shape of input the form builds (tests/integration/console.rs starts both
on loopback). Every check raises on failure; the script gives up after 180 s. Screenshots
of the console, light and dark, wide and at 375 px, are written to SCREENSHOT_DIR.
"""

import json
import os
import re
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

from playwright.sync_api import expect, sync_playwright

BASE = sys.argv[1].rstrip("/")
SHOTS = Path(sys.argv[2])
SHAPES = sys.argv[3].rstrip("/")
CHROMIUM = os.environ.get("CARMY_CHROMIUM", "/usr/bin/chromium")
AXE = Path(__file__).parent / "node_modules" / "axe-core" / "axe.min.js"
KNOWN_TOKEN = "shop-known-demo-token"
INTERNAL_TOKEN = "shop-internal-demo-token"
# API answers the scenario provokes on purpose (a refused argument, a call without the
# confirmation permission, a refused webhook URL): the browser logs each as "Failed to load
# resource", which is not a fault of the page. Anything else failing is: the page learns
# which views its caller may open from the console's session route, never from a 404.
EXPECTED_FAILURES = {
    ("POST", "/agent/execute", 400),
    ("POST", "/agent/execute", 403),
    ("POST", "/agent/events/subscriptions", 400),
}

signal.alarm(180)


class Watch:
    """Everything the page must not do: leave the origin, log an error, break its CSP."""

    def __init__(self, page, base=BASE):
        self.origin = urlsplit(base)[:2]
        self.foreign = []
        self.errors = []
        self.failed = []
        page.on("request", self.request)
        page.on("console", self.console)
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))
        page.on("response", self.response)
        # Recorded by the page itself: a violation is also logged, but this names the directive.
        page.add_init_script(
            "window.__csp = [];"
            "document.addEventListener('securitypolicyviolation', (e) =>"
            " window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));"
        )

    def request(self, request):
        if urlsplit(request.url)[:2] != self.origin:
            self.foreign.append(request.url)

    def response(self, response):
        if response.status >= 400:
            path = urlsplit(response.url).path
            self.failed.append((response.request.method, path, response.status))

    def console(self, message):
        if message.type != "error":
            return
        if message.text.startswith("Failed to load resource"):
            return  # checked by status in `check`, which knows which answers were provoked
        self.errors.append(message.text)

    def check(self, page, where):
        csp = page.evaluate("window.__csp")
        unexpected = [failure for failure in self.failed if failure not in EXPECTED_FAILURES]
        assert not self.foreign, f"{where}: requests left the origin: {self.foreign}"
        assert not self.errors, f"{where}: console errors: {self.errors}"
        assert not csp, f"{where}: CSP violations: {csp}"
        assert not unexpected, f"{where}: unexpected failed requests: {unexpected}"


def axe_scan(page, where):
    """axe-core's WCAG A/AA rules and best practices: no serious or critical violation."""
    page.evaluate(AXE.read_text())
    result = page.evaluate(
        "async () => await axe.run(document, {resultTypes: ['violations']})"
    )
    serious = [
        f"{violation['id']} ({violation['impact']}): {violation['help']} — "
        + "; ".join(node["target"][0] for node in violation["nodes"][:3])
        for violation in result["violations"]
        if violation["impact"] in ("serious", "critical")
    ]
    assert not serious, f"{where}: accessibility violations:\n" + "\n".join(serious)


def open_tool(page, name):
    page.get_by_role("link", name=re.compile(rf"^{name}\b")).click()
    expect(page.get_by_role("heading", level=2, name=name)).to_be_visible()


def field_box(page, label):
    """The box of the field labelled `label`: its input, help and error."""
    return page.locator(".field", has=page.get_by_label(label, exact=True)).last


def run_scenario(browser, scheme):
    context = browser.new_context(color_scheme=scheme, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    watch = Watch(page)

    # A person opening discovery lands on the console.
    page.goto(f"{BASE}/.well-known/agent")
    expect(page).to_have_url(f"{BASE}/agent/console/")
    expect(page.get_by_role("link", name=re.compile(r"^create_order\b"))).to_be_visible()
    expect(page.get_by_role("link", name=re.compile(r"^sales_summary\b"))).to_have_count(0)

    # The search box filters the list.
    page.get_by_label("Search tools").fill("report")
    expect(page.locator(".tool-list li")).to_have_count(1)
    page.get_by_label("Search tools").fill("")

    # create_order from the form: fields by their labels, the button by its name.
    open_tool(page, "create_order")
    page.get_by_label("sku", exact=True).fill("KB-01")
    page.get_by_label("quantity", exact=True).fill("2")
    page.get_by_role("button", name="Run", exact=True).click()
    result = page.get_by_label("Result")
    expect(result).to_contain_text('"order_id"')
    order_id = int(re.search(r'"order_id": (\d+)', result.inner_text()).group(1))

    # A bad quantity: the server's error next to the quantity field, which says it is invalid.
    page.get_by_label("quantity", exact=True).fill("0")
    page.get_by_role("button", name="Run", exact=True).click()
    quantity = field_box(page, "quantity")
    expect(quantity.locator(".field-error")).to_contain_text("minimum of 1")
    expect(page.get_by_label("quantity", exact=True)).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("quantity", exact=True)).to_have_accessible_description(
        re.compile("minimum of 1")
    )
    expect(field_box(page, "sku").locator(".field-error")).to_have_count(0)
    expect(page.locator(".result.bad")).to_contain_text("INVALID_ARGUMENTS")

    # A missing required field: marked on the field the call left out.
    page.get_by_label("sku", exact=True).fill("")
    page.get_by_label("quantity", exact=True).fill("1")
    page.get_by_label("quantity", exact=True).press("Enter")  # Enter runs the form
    expect(field_box(page, "sku").locator(".field-error")).to_contain_text("required")
    axe_scan(page, f"{scheme}: a refused call")
    page.screenshot(path=SHOTS / f"console-{scheme}-field-error.png", full_page=True)

    # The request id field keeps the id the result shows, so running again is a safe retry;
    # new arguments bring a new id.
    page.get_by_label("sku", exact=True).fill("KB-01")
    page.get_by_role("button", name="Run", exact=True).click()
    expect(result).to_contain_text('"order_id"')
    shown = page.locator(".result.ok .meta code").nth(1).inner_text()
    assert page.get_by_label("Request id").input_value() == shown, "the field shows the id sent"
    page.get_by_label("quantity", exact=True).fill("3")
    assert page.get_by_label("Request id").input_value() != shown, "new arguments, new id"

    # The same request id twice: the second answer is the recorded one, marked as a replay.
    page.get_by_label("sku", exact=True).fill("KB-01")
    page.get_by_label("Request id").fill(f"browser-{scheme}-replay")
    page.get_by_role("button", name="Run", exact=True).click()
    expect(result).to_contain_text('"order_id"')
    first = result.inner_text()
    page.get_by_label("Request id").fill(f"browser-{scheme}-replay")
    page.get_by_role("button", name="Run", exact=True).click()
    expect(page.locator(".result.ok .badge", has_text="replayed")).to_be_visible()
    assert result.inner_text() == first, "a replay shows the recorded result"

    # The raw JSON mode sends what is typed.
    page.get_by_role("button", name="JSON", exact=True).click()
    page.get_by_label("arguments", exact=True).fill('{"sku": "KB-01", "colour": "red"}')
    page.get_by_role("button", name="Run", exact=True).click()
    expect(page.locator(".result.bad")).to_contain_text("colour")
    page.get_by_role("button", name="Form", exact=True).click()

    # generate_report streams: progress with a value and "N of M", then the result.
    open_tool(page, "generate_report")
    page.get_by_label("seconds", exact=True).fill("2")
    page.get_by_role("button", name="Run", exact=True).click()
    progress = page.get_by_role("progressbar", name="Progress of generate_report")
    expect(progress).to_have_attribute("value", re.compile(r"^[1-7]$"))
    expect(page.locator(".progress-line")).to_contain_text(re.compile(r"\d of 8"))
    expect(page.get_by_label("Result")).to_contain_text("sales report over 2 seconds")
    page.screenshot(path=SHOTS / f"console-{scheme}-report.png", full_page=True)

    # The known token, entered once for the tab, makes sales_summary appear.
    page.get_by_label("Token", exact=True).fill(KNOWN_TOKEN)
    page.get_by_label("Token", exact=True).press("Enter")
    expect(page.get_by_role("link", name=re.compile(r"^sales_summary\b"))).to_be_visible()
    open_tool(page, "sales_summary")
    page.get_by_role("button", name="Run", exact=True).click()
    expect(page.get_by_label("Result")).to_contain_text('"orders"')

    # cancel_order needs a token holding confirm:cancel_order, which this one lacks: the form
    # says so before the run, and the refusal names the permission, its code as code.
    open_tool(page, "cancel_order")
    expect(page.locator(".confirm-note").first).to_contain_text("confirm:cancel_order")
    page.get_by_label("order_id", exact=True).fill(str(order_id))
    page.get_by_role("button", name="Run", exact=True).click()
    expect(page.locator(".confirm .confirm-note")).to_contain_text("confirm:cancel_order")
    page.get_by_role("button", name="Confirm and run").click()
    refused = page.locator(".result.bad")
    expect(refused).to_contain_text("CONFIRMATION_REQUIRED")
    expect(refused.locator(".error-message code")).to_have_text("cancel_order")
    assert "`" not in refused.locator(".error-message").inner_text(), "no raw backticks"
    expect(refused).to_contain_text("does not hold confirm:cancel_order")

    # A background run: answered at once, followed live, then listed under Executions.
    open_tool(page, "generate_report")
    page.get_by_label("seconds", exact=True).fill("1")
    page.get_by_label("Run in the background").check()
    page.get_by_role("button", name="Run", exact=True).click()
    expect(page.get_by_text("Running in the background as")).to_be_visible()
    expect(page.get_by_label("Result")).to_contain_text("sales report over 1 seconds")
    page.get_by_role("navigation").get_by_role("link", name="Executions").click()
    expect(page.locator("tbody tr", has_text="generate_report").first).to_contain_text("completed")
    axe_scan(page, f"{scheme}: executions")

    # The token stays for the tab: a reload keeps the caller.
    page.reload()
    expect(page.get_by_role("link", name=re.compile(r"^sales_summary\b"))).to_be_visible()
    expect(page.get_by_role("link", name="Event subscriptions")).to_have_count(0)

    # The internal token: a confirmation-required tool behind a confirm step, and events.
    page.get_by_label("Token", exact=True).fill(INTERNAL_TOKEN)
    page.get_by_role("button", name="Use token").click()
    expect(page.get_by_role("link", name="Event subscriptions")).to_be_visible()
    open_tool(page, "cancel_order")
    page.get_by_label("order_id", exact=True).fill(str(order_id))
    page.get_by_role("button", name="Run", exact=True).click()
    confirm = page.get_by_role("button", name="Confirm and run")
    expect(confirm).to_be_focused()
    expect(page.get_by_label("Result")).to_have_count(0)
    confirm.click()
    expect(page.get_by_label("Result")).to_contain_text('"cancelled"')

    # Event subscriptions: a loopback receiver is refused by the SSRF guard, and said so.
    page.get_by_role("link", name="Event subscriptions").click()
    page.get_by_label("url", exact=True).fill("http://127.0.0.1:9/hook")
    page.get_by_role("button", name="Subscribe").click()
    expect(page.locator(".result.bad")).to_contain_text("WEBHOOK_URL_REFUSED")
    axe_scan(page, f"{scheme}: events")

    # Health, from the badge in the bar.
    page.get_by_role("link", name=re.compile("^Health")).first.click()
    expect(page.get_by_role("heading", name="Health")).to_be_visible()
    expect(page.locator("table")).to_contain_text("config")

    # Forgetting the token hides sales_summary again.
    page.get_by_role("button", name="Forget").click()
    expect(page.get_by_role("link", name=re.compile(r"^sales_summary\b"))).to_have_count(0)

    open_tool(page, "create_order")
    page.screenshot(path=SHOTS / f"console-{scheme}.png", full_page=True)
    watch.check(page, scheme)
    context.close()


def keyboard_only(browser):
    """Search, pick a tool and run it without the mouse."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    watch = Watch(page)
    page.goto(f"{BASE}/agent/console/")
    expect(page.get_by_role("link", name=re.compile(r"^list_products\b"))).to_be_visible()
    page.get_by_label("Search tools").focus()
    page.keyboard.type("list_products")
    page.keyboard.press("Tab")  # the one tool left in the list
    expect(page.get_by_role("link", name=re.compile(r"^list_products\b"))).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", level=2, name="list_products")).to_be_visible()
    for _ in range(12):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Run":
            break
    expect(page.get_by_role("button", name="Run", exact=True)).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_label("Result")).to_contain_text("KB-01")
    watch.check(page, "keyboard")
    context.close()


def narrow(browser, scheme):
    """375 px wide: nothing wider than the screen."""
    context = browser.new_context(color_scheme=scheme, viewport={"width": 375, "height": 812})
    page = context.new_page()
    watch = Watch(page)
    page.goto(f"{BASE}/")  # the example serves the console at its root too
    open_tool(page, "create_order")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 375, f"the page is {width} px wide at 375 px"
    axe_scan(page, f"{scheme}: 375 px")
    page.screenshot(path=SHOTS / f"console-{scheme}-375.png", full_page=True)
    watch.check(page, f"{scheme} 375 px")
    context.close()


def every_shape(browser):
    """An enum as a select, a boolean, an array of objects, a nested object, optional fields:
    the form sends exactly the JSON they describe, and a nested field's error lands on it."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    watch = Watch(page, SHAPES)
    page.goto(f"{SHAPES}/agent/console/#/tools/ship")
    expect(page.get_by_role("heading", level=2, name="ship")).to_be_visible()
    size = page.get_by_label("size", exact=True)
    expect(size.locator("option")).to_have_text(["Choose…", "small", "large"])
    size.select_option("large")
    page.get_by_label("gift", exact=True).check()
    page.get_by_role("button", name="Add lines item").click()
    page.get_by_role("button", name="Add lines item").click()
    lines = page.locator("fieldset", has=page.locator("legend", has_text="lines")).first
    items = lines.locator(".item")
    expect(items).to_have_count(2)
    items.nth(0).get_by_label("sku", exact=True).fill("A-1")
    items.nth(0).get_by_label("quantity", exact=True).fill("2")
    items.nth(1).get_by_label("sku", exact=True).fill("B-2")
    items.nth(1).get_by_label("quantity", exact=True).fill("3")
    page.get_by_label("city", exact=True).fill("Lisbon")
    # optional: a three-way choice for the boolean, nothing sent for the empty text
    expect(page.get_by_label("signature", exact=True).locator("option")).to_have_text(
        ["(none)", "true", "false"])
    page.get_by_label("signature", exact=True).select_option("false")
    page.get_by_role("button", name="Run", exact=True).click()
    result = page.get_by_label("Result")
    expect(result).to_contain_text('"city"')
    sent = json.loads(result.inner_text())
    assert sent == {
        "size": "large", "gift": True,
        "lines": [{"sku": "A-1", "quantity": 2}, {"sku": "B-2", "quantity": 3}],
        "address": {"city": "Lisbon"}, "signature": False,
    }, sent

    # Removing an item, then a bad quantity in a nested object: the error is on that field.
    items.nth(0).get_by_role("button", name="Remove").click()
    expect(items).to_have_count(1)
    items.nth(0).get_by_label("quantity", exact=True).fill("0")
    page.get_by_role("button", name="Run", exact=True).click()
    quantity = items.nth(0).get_by_label("quantity", exact=True)
    expect(quantity).to_have_attribute("aria-invalid", "true")
    expect(items.nth(0).locator(".field-error")).to_contain_text("minimum of 1")
    axe_scan(page, "every shape")
    page.screenshot(path=SHOTS / "console-shapes.png", full_page=True)
    # The JSON mode starts from what the form holds.
    page.get_by_role("button", name="JSON", exact=True).click()
    typed = json.loads(page.get_by_label("arguments", exact=True).input_value())
    assert typed["lines"] == [{"sku": "B-2", "quantity": 0}], typed
    watch.check(page, "every shape")
    context.close()


def main():
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        for scheme in ("light", "dark"):
            run_scenario(browser, scheme)
            narrow(browser, scheme)
        keyboard_only(browser)
        every_shape(browser)
        browser.close()
    print(f"console: every check passed; screenshots in {SHOTS}")


if __name__ == "__main__":
    main()
