"""The guide's picture of the explain page (docs/guide.md): docs/figures/explain_page.png.

    minitensor train                       # the default date model, in runs/date
    python scripts/explain_screenshot.py runs/date

writes the page of "3rd of May 2021" in Chinese with ``minitensor explain``, opens it in
headless Chromium (Selenium, as tests/test_viz_browser.py does), chooses the encoder-decoder
attention of block 2, hovers a cell and saves the screenshot.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("run", help="a trained run folder of the date task")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "figures", "explain_page.png"))
    args = parser.parse_args()

    from selenium import webdriver
    from selenium.webdriver import ActionChains
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    with tempfile.TemporaryDirectory() as folder:
        page = os.path.join(folder, "explain.html")
        command = [sys.executable, "-m", "minitensor", "explain", "--checkpoint", args.run, "3rd of May 2021"]
        subprocess.run(command + ["--lang", "zh", "--out", page], check=True)
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
        for flag in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1000,900",
        ):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        try:
            # each step waits (a few seconds at most) for the page's script to have drawn what
            # the next one uses, as tests/browser.py does: never a fixed sleep
            wait = WebDriverWait(driver, 20, poll_frequency=0.05)
            driver.get("file://" + page)
            data = json.loads(driver.find_element("id", "page-data").get_attribute("textContent"))
            layer = [(layer["kind"], layer["block"]) for layer in data["layers"]].index(("cross", 2))
            wait.until(lambda d: d.find_elements("css selector", "#heatmap rect"))
            choose = "const s = document.getElementById('layer'); s.value = arguments[0];"
            driver.execute_script(choose + "s.dispatchEvent(new Event('change'));", str(layer))
            wanted = len(data["layers"][layer]["queries"]) * len(data["layers"][layer]["keys"])
            cells = wait.until(
                lambda d: (found := d.find_elements("css selector", "#heatmap rect")) and len(found) == wanted and found
            )
            hint = driver.find_element("id", "tooltip").text
            ActionChains(driver).move_to_element(cells[len(cells) // 2]).perform()
            wait.until(lambda d: d.find_element("id", "tooltip").text != hint)
            driver.save_screenshot(args.out)
        finally:
            driver.quit()
    print("wrote", args.out)


if __name__ == "__main__":
    main()
