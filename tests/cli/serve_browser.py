#!/usr/bin/python3
"""meshsim serve's page in headless Chromium, driven as a person would drive it.

Usage: serve_browser.py MESHSIM_BINARY SOURCE_DIR WORK_DIR

Starts `meshsim serve --port 0`, plans Llama 3 8B from its preset (and checks the page's step
and peak against `meshsim plan --json`), Mixtral 8x7B from its config.json uploaded through the
page, and a search of Llama 3 8B's layouts; then opens plan.html (DeepSeek-V3 on 512 H100)
from disk with the network off. Any error in the browser's console fails the test.

Needs Debian's python3-selenium, chromium and chromium-driver; exits 77 (skipped) without them.
With MESHSIM_SCREENSHOT=FILE.png it saves the serve page's screenshot there. A sanitizer's build
(make sanitize) sets MESHSIM_TEST_SLOWDOWN=10: serve's --max-seconds and the page's waits are
that many times longer, as the instrumented -O1 plans are slower (the search of answer 3 ran past
60 s under ThreadSanitizer with the suite beside it).
"""
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time

CHROMIUM = '/usr/bin/chromium'
CHROMEDRIVER = '/usr/bin/chromedriver'
SKIPPED = 77


class Failure(Exception):
    """A check that failed: one line."""


def check(ok, what):
    if not ok:
        raise Failure(what)
    print('ok:', what)


SLOWDOWN = float(os.environ.get('MESHSIM_TEST_SLOWDOWN', '1'))


def start_server(binary, work):
    """meshsim serve on a free port: the process, its URL and its stderr's file."""
    log_path = os.path.join(work, 'serve.log')
    log = open(log_path, 'w')
    limit = '%g' % (60 * SLOWDOWN)
    proc = subprocess.Popen([binary, 'serve', '--port', '0', '--max-seconds', limit],
                            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True)
    log.close()
    lines = queue.Queue()

    def read():  # every line, so the server never blocks on a full pipe
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 30
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Failure('meshsim serve printed no listening line within 30 s')
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        if line is None:
            raise Failure('meshsim serve exited (%s) before listening: %s' % (proc.wait(), tail(log_path)))
        m = re.search(r'listening on (http://127\.0\.0\.1:\d+)', line)
        if m:
            print('ok: meshsim serve listens on', m.group(1))
            return proc, m.group(1) + '/', log_path


def stop_server(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tail(path, lines=5):
    try:
        with open(path) as f:
            return ' | '.join(f.read().strip().splitlines()[-lines:])
    except OSError:
        return ''


def meshsim_json(binary, args, timeout=600):
    r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise Failure('meshsim %s exited %d' % (' '.join(args), r.returncode))
    return json.loads(r.stdout)


def severe(driver):
    """The browser's SEVERE console entries since the last call."""
    try:
        return [e for e in driver.get_log('browser') if e.get('level') == 'SEVERE']
    except Exception as e:  # a driver without the log
        raise Failure('cannot read the browser log: %s' % e)


def run(binary, source, work, webdriver, By, Select, WebDriverWait):
    os.makedirs(work, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for a in ('--headless=new', '--no-sandbox', '--disable-gpu', '--window-size=1600,1200',
              '--disable-dev-shm-usage', '--no-first-run'):
        options.add_argument(a)
    options.set_capability('goog:loggingPrefs', {'browser': 'ALL'})
    service = webdriver.chrome.service.Service(executable_path=CHROMEDRIVER)
    server = driver = None
    try:
        server, url, log_path = start_server(binary, work)
        driver = webdriver.Chrome(service=service, options=options)

        def by_id(name, within=None):
            return (within or driver).find_element(By.ID, name)

        def error_text():
            try:
                return by_id('error').text.strip()
            except Exception:
                return ''

        def wait(seconds, condition, what):
            try:
                return WebDriverWait(driver, seconds * SLOWDOWN,
                                     poll_frequency=0.2).until(lambda d: condition())
            except Failure:
                raise
            except Exception:
                why = error_text()
                raise Failure('waited %g s for %s%s' % (seconds * SLOWDOWN, what,
                                                         ': the page says ' + why if why else ''))

        def answers_reach(n, seconds):
            def done():
                why = error_text()
                if why:
                    raise Failure('answer %d: the page says: %s' % (n, why))
                return driver.find_element(By.TAG_NAME, 'body').get_attribute('data-answers') == str(n)
            wait(seconds, done, 'answer %d' % n)
            return driver.find_element(By.CSS_SELECTOR, '#results > .card')  # the newest

        def type_into(name, text):
            box = by_id(name)
            box.clear()
            if text:
                box.send_keys(text)

        # b. Llama 3 8B from its preset, as `meshsim plan` plans it.
        driver.get(url)
        # (the waits are long: ctest runs the suite two tests at a time on two cores)
        wait(120, lambda: len(Select(by_id('preset')).options) > 1, 'the presets from /api/options')
        Select(by_id('preset')).select_by_value('llama3-8b')
        type_into('cluster', '8xh100')
        Select(by_id('precision')).select_by_value('bf16')
        Select(by_id('zero')).select_by_value('3')
        type_into('micro-batch-size', '1')
        Select(by_id('recompute')).select_by_value('full')
        type_into('global-batch-size', '64')
        by_id('run').click()
        card = answers_reach(1, 120)
        summary = card.find_element(By.CSS_SELECTOR, '#plan-summary')
        page_step = float(summary.get_attribute('data-step-seconds'))
        page_peak = int(summary.get_attribute('data-peak-bytes'))
        doc = meshsim_json(binary, ['plan', '--preset', 'llama3-8b', '--cluster', '8xh100', '--precision', 'bf16',
                                    '--zero', '3', '--micro-batch-size', '1', '--recompute', 'full',
                                    '--global-batch-size', '64', '--json'])
        step, peak = doc['step_seconds'], max(s['peak_bytes'] for s in doc['stages'])
        check(abs(page_step - step) <= 1e-12 * abs(step),
              'llama3-8b step: page %r s, meshsim plan --json %r s' % (page_step, step))
        check(page_peak == peak, 'llama3-8b peak per GPU: page %d B, meshsim plan --json %d B' % (page_peak, peak))

        # c. Mixtral 8x7B from its Hugging Face config.json, uploaded.
        Select(by_id('preset')).select_by_value('')
        config = os.path.abspath(os.path.join(source, 'src', 'models', 'hf_configs', 'mixtral-8x7b.json'))
        by_id('hf-config').send_keys(config)
        wait(60, lambda: 'mixtral' in by_id('hf-status').text.lower(), 'the config.json to load')
        type_into('cluster', '8xh100')
        Select(by_id('zero')).select_by_value('3')
        type_into('ep', '8')
        by_id('run').click()
        card = answers_reach(2, 300)
        check('mixtral' in card.text.lower(), 'the newest card names mixtral')
        check(len(card.find_elements(By.CSS_SELECTOR, '#plan-summary')) == 1, 'the mixtral card has its #plan-summary')

        # d. A search of Llama 3 8B's layouts for a global batch of 64.
        Select(by_id('preset')).select_by_value('llama3-8b')
        by_id('hf-clear').click()  # ep 8 and zero 3 stay: a search takes no layout from the form
        if not by_id('search').is_selected():
            by_id('search').click()
        type_into('global-batch-size', '64')
        type_into('top', '5')
        by_id('run').click()
        card = answers_reach(3, 300)
        rows = card.find_elements(By.CSS_SELECTOR, '#search-table tbody tr')
        check(len(rows) >= 1, 'the search card ranks %d layouts' % len(rows))

        # e. The comparison has a column per answer.
        columns = driver.find_elements(By.CSS_SELECTOR, '#compare thead th.answer')
        check(len(columns) == 3, 'the comparison has %d answer columns' % len(columns))
        charts = driver.find_element(By.TAG_NAME, 'body').get_attribute('data-charts-rendered')
        check(charts is not None and int(charts) >= 3, 'the serve page shows %s charts' % charts)

        # f. Nothing went wrong in the console.
        errors = severe(driver)
        for e in errors:
            print('console:', e.get('message'))
        check(not errors, 'the serve page logged %d console errors' % len(errors))

        # g.
        shot = os.environ.get('MESHSIM_SCREENSHOT')
        if shot:
            driver.save_screenshot(shot)
            print('saved', shot)

        # h. plan.html from disk, offline.
        # An MoE model over a 4-stage pipeline, planned in about 2 s (DeepSeek-V3 over 64 nodes,
        # for the same checks, took 48 s).
        out = os.path.join(work, 'mixtral')
        shutil.rmtree(out, ignore_errors=True)  # a rerun's folder: plan --out wants it new
        args = ['plan', '--preset', 'mixtral-8x7b', '--cluster', '4x8xh100', '--precision', 'bf16',
                '--pp', '4', '--ep', '8', '--zero', '1', '--global-batch-size', '64',
                '--micro-batch-size', '1', '--recompute', 'full', '--out', out,
                # the pipeline's stages wait on each other: far longer than 60 s under
                # ThreadSanitizer (make sanitize)
                '--comm-timeout', '1200']
        r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            raise Failure('meshsim %s exited %d' % (' '.join(args), r.returncode))
        page = os.path.join(out, 'plan.html')
        check(os.path.isfile(page), 'meshsim plan --out wrote plan.html')
        size = os.path.getsize(page)
        check(size < 2 * 1000 * 1000, 'plan.html is %d bytes (under 2 MB)' % size)
        try:
            driver.set_network_conditions(offline=True, latency=0, download_throughput=0, upload_throughput=0)
        except Exception:
            pass
        driver.get('file://' + os.path.abspath(page))
        body = lambda: driver.find_element(By.TAG_NAME, 'body')
        wait(60, lambda: body().get_attribute('data-charts-rendered') is not None, 'plan.html to draw its charts')
        failed = body().get_attribute('data-report-errors')
        check(failed in (None, '0'), 'plan.html drew without errors (%s)' % (failed or 'none'))
        drawn = [c for c in driver.find_elements(By.TAG_NAME, 'canvas') if int(c.get_attribute('width') or 0) > 0]
        check(len(drawn) >= 2, 'plan.html has %d drawn canvases (data-charts-rendered %s)'
              % (len(drawn), body().get_attribute('data-charts-rendered')))
        errors = severe(driver)
        for e in errors:
            print('console:', e.get('message'))
        check(not errors, 'plan.html logged %d console errors' % len(errors))
        return 0
    except Failure:
        if server is not None:
            print('meshsim serve said:', tail(os.path.join(work, 'serve.log')))
        raise
    finally:
        if driver is not None:
            driver.quit()
        stop_server(server)


def main():
    if len(sys.argv) != 4:
        print('usage: serve_browser.py MESHSIM_BINARY SOURCE_DIR WORK_DIR')
        return 2
    binary, source, work = (os.path.abspath(a) for a in sys.argv[1:])
    try:
        from selenium import webdriver
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select, WebDriverWait
        import selenium.webdriver.chrome.service  # noqa: F401 (webdriver.chrome.service below)
    except ImportError:
        print('skipped: no selenium for python3 (Debian: apt install python3-selenium)')
        return SKIPPED
    for path, package in ((CHROMEDRIVER, 'chromium-driver'), (CHROMIUM, 'chromium')):
        if not os.access(path, os.X_OK):
            print('skipped: no %s (Debian: apt install %s)' % (path, package))
            return SKIPPED
    try:
        return run(binary, source, work, webdriver, By, Select, WebDriverWait)
    except Failure as e:
        print('FAIL:', e)
        return 1
    except Exception as e:  # the driver or the browser itself
        print('FAIL: %s: %s' % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else ''))
        return 1


if __name__ == '__main__':
    sys.exit(main())
