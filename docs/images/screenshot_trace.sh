#!/usr/bin/env bash
# Render a meshsim trace.json in Catapult's trace viewer (the viewer behind the
# old chrome://tracing) and save a PNG screenshot, fully offline.
#
# Usage: CATAPULT_DIR=/path/to/catapult docs/images/screenshot_trace.sh TRACE.json OUT.png [WIDTH HEIGHT]
#
# SELECT=name (default all_reduce) selects the earliest slice with that name on
# the first GPU so the bottom panel shows its details (args); SELECT= selects nothing.
#
# CATAPULT_DIR is an extracted copy of github.com/catapult-project/catapult
# (only tracing/, common/ and third_party/ are needed; tracing/test_data and
# third_party/vinn's d8 binaries are not), e.g. (tested at catapult 6fd8bbe7):
#   git --git-dir=catapult.git archive HEAD -- tracing common third_party | tar -x -C "$CATAPULT_DIR"
# Needs python3 and chromium (Debian: apt-get install -y chromium).
#
# Why not `chromium --headless --screenshot`: the viewer imports the trace in
# requestAnimationFrame-driven chunks, which a one-shot screenshot (even with
# --virtual-time-budget) captures mid-import ("Importing..." dialog). So we
# drive Chromium over --remote-debugging-pipe (no extra packages needed) and
# wait until the model is loaded before taking the screenshot.
set -euo pipefail

trace=${1:?usage: screenshot_trace.sh TRACE.json OUT.png [WIDTH HEIGHT]}
out=${2:?usage: screenshot_trace.sh TRACE.json OUT.png [WIDTH HEIGHT]}
width=${3:-1600}
height=${4:-1000}
: "${CATAPULT_DIR:?set CATAPULT_DIR to an extracted catapult checkout}"
chromium=${CHROMIUM:-chromium}
select=${SELECT-all_reduce}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. Standalone HTML = trace viewer + gzipped trace (trace2html runs on python3 as is).
python3 "$CATAPULT_DIR/tracing/bin/trace2html" --quiet --title "$(basename "$trace")" \
  --output "$tmp/trace.html" "$trace"

# 2. Load it in headless Chromium, wait for the import to finish, screenshot.
python3 - "$chromium" "$tmp" "$out" "$width" "$height" "$select" <<'EOF'
import base64, json, os, subprocess, sys, time
chromium, tmp, out, width, height, select = sys.argv[1:4] + [int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]]

# Chromium reads CDP commands on fd 3 and writes replies on fd 4, NUL-separated.
to_chrome_r, to_chrome_w = os.pipe()
from_chrome_r, from_chrome_w = os.pipe()
def child_fds():  # runs in the child before exec: move the pipe ends to fds 3/4
    r, w = os.dup(to_chrome_r), os.dup(from_chrome_w)  # dodge fd 3/4 clashes
    os.dup2(r, 3)
    os.dup2(w, 4)
proc = subprocess.Popen(
    [chromium, '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars',
     '--remote-debugging-pipe', '--user-data-dir=' + os.path.join(tmp, 'profile'),
     '--window-size=%d,%d' % (width, height)],
    preexec_fn=child_fds, pass_fds=(3, 4),
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
os.close(to_chrome_r); os.close(from_chrome_w)
writer = os.fdopen(to_chrome_w, 'wb', buffering=0)
reader = os.fdopen(from_chrome_r, 'rb', buffering=0)
buf, next_id = b'', 0

def cdp(method, session=None, **params):
    global buf, next_id
    next_id += 1
    msg = {'id': next_id, 'method': method, 'params': params}
    if session:
        msg['sessionId'] = session
    writer.write(json.dumps(msg).encode() + b'\0')
    while True:  # skip events until our reply arrives
        while b'\0' not in buf:
            chunk = reader.read(1 << 16)
            if not chunk:
                sys.exit('chromium exited')
            buf += chunk
        raw, buf = buf.split(b'\0', 1)
        reply = json.loads(raw)
        if reply.get('id') == next_id:
            if 'error' in reply:
                sys.exit('%s: %s' % (method, reply['error']))
            return reply['result']

try:
    target = cdp('Target.createTarget', url='about:blank')['targetId']
    s = cdp('Target.attachToTarget', targetId=target, flatten=True)['sessionId']
    cdp('Emulation.setDeviceMetricsOverride', s, width=width, height=height,
        deviceScaleFactor=1, mobile=False)
    cdp('Page.navigate', s, url='file://' + os.path.join(tmp, 'trace.html'))
    # trace2html's bootstrap (a top-level `let`) sets g_timelineViewEl.model once the import is done;
    # an import error shows an overlay titled "Import error" instead.
    for _ in range(600):
        state = cdp('Runtime.evaluate', s, returnByValue=True, expression='''
            (typeof g_timelineViewEl !== "undefined" && g_timelineViewEl.model) ? "ready" :
            (document.body && document.body.innerText.includes("Import error")) ? "error" : "wait"
        ''')['result'].get('value')
        if state != 'wait':
            break
        time.sleep(0.1)
    if state != 'ready':
        sys.exit('trace viewer did not load the trace (%s)' % state)
    if select:  # show one slice's details in the analysis panel
        cdp('Runtime.evaluate', s, expression='''(() => {
            const slices = [];
            for (const t of g_timelineViewEl.model.getAllThreads())
              for (const e of t.sliceGroup.slices)
                if (e.title === %s) slices.push([t.parent.pid, e.start, e]);
            slices.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
            if (slices.length)
              g_timelineViewEl.brushingStateController.changeSelectionFromTimeline(
                  new tr.model.EventSet([slices[0][2]]));
        })()''' % json.dumps(select))
    time.sleep(1.0)  # let the track view paint
    png = cdp('Page.captureScreenshot', s, format='png')['data']
    with open(out, 'wb') as f:
        f.write(base64.b64decode(png))
    print('wrote', out)
finally:
    try:
        cdp('Browser.close')
    except SystemExit:
        pass
    proc.wait(timeout=10)
EOF
