// The page `meshsim serve` answers at /: a form for a plan (a preset or a Hugging Face
// config.json, a cluster, a layout, or a search of every layout), sent to /api/plan, and the
// last answers side by side, each drawn by plan.js's MeshsimPlan.render. The tests wait on
// <body data-answers="N"> (answers drawn so far) and data-charts-rendered (charts on the page).
'use strict';
(function () {
  const root = document.getElementById('serve');
  const body = document.body;
  const KEEP = 4; // answers kept side by side
  const kept = []; // newest first: { n, card, title, doc, charts }
  let answers = 0, failures = 0;
  let limits = {};
  let presets = [];
  let hfConfig = null, hfName = '', pendingRead = null;

  // No /favicon.ico request: the server has none.
  if (!document.querySelector('link[rel~="icon"]')) {
    const icon = document.createElement('link');
    icon.rel = 'icon';
    icon.href = 'data:,';
    document.head.appendChild(icon);
  }

  const el = MeshsimPlan.el; // el(parent, tag, props, text): a new element, appended
  const $ = (id) => document.getElementById(id);
  const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
  function field(parent, id, label, tag, props) {
    const f = el(parent, 'label', { className: 'field', htmlFor: id });
    el(f, 'span', {}, label);
    return el(f, tag, Object.assign({ id }, props || {}));
  }
  function checkbox(parent, id, label) {
    const f = el(parent, 'label', { className: 'field check', htmlFor: id });
    const c = el(f, 'input', { id, type: 'checkbox' });
    el(f, 'span', {}, label);
    return c;
  }
  function fillSelect(select, values, blank) {
    select.textContent = '';
    if (blank !== undefined) el(select, 'option', { value: '' }, blank);
    values.forEach((v) => (typeof v === 'string' ? el(select, 'option', { value: v }, v) : el(select, 'option', { value: v.value }, v.text)));
  }
  function showError(text) { $('error').textContent = text || ''; }

  // The page.
  const header = el(root, 'header');
  el(header, 'h1', {}, 'meshsim serve');
  const intro = el(header, 'p', {}, 'Predict the memory and step time of a training layout on a cluster, as meshsim plan does on the command line. Blank fields are left to meshsim.');
  const form = el(root, 'form', { id: 'plan-form', noValidate: true });

  const model = el(form, 'fieldset');
  el(model, 'legend', {}, 'Model');
  const presetSel = field(model, 'preset', 'preset', 'select');
  fillSelect(presetSel, [], 'choose…');
  const drop = el(model, 'div', { className: 'drop', id: 'hf-drop' });
  const dropLabel = el(drop, 'label', { htmlFor: 'hf-config' }, 'or a Hugging Face config.json (drop it here): ');
  const fileInput = el(dropLabel, 'input', { type: 'file', id: 'hf-config', accept: '.json,application/json' });
  const hfStatus = el(drop, 'div', { className: 'hf-status', id: 'hf-status' });
  const hfText = el(hfStatus, 'span');
  const hfClear = el(hfStatus, 'button', { type: 'button', id: 'hf-clear' }, 'clear');
  const hfError = el(drop, 'div', { className: 'inline-error', id: 'hf-error' });
  hfStatus.hidden = true;

  const where = el(form, 'fieldset');
  el(where, 'legend', {}, 'Cluster');
  const cluster = field(where, 'cluster', 'cluster (e.g. 8xh100, 4x8xh100)', 'input', { value: '8xh100', spellcheck: false });
  cluster.setAttribute('list', 'cluster-list');
  const clusterList = el(where, 'datalist', { id: 'cluster-list' });
  const precision = field(where, 'precision', 'precision', 'select');

  const layout = el(form, 'fieldset');
  el(layout, 'legend', {}, 'Layout');
  const num = (parent, id, label) => field(parent, id, label, 'input', { type: 'number', min: 1, step: 1, placeholder: 'auto' });
  num(layout, 'tp', 'tensor parallel');
  num(layout, 'pp', 'pipeline stages');
  num(layout, 'cp', 'context parallel');
  num(layout, 'ep', 'expert parallel');
  fillSelect(field(layout, 'zero', 'ZeRO', 'select'), ['0', '1', '2', '3'], 'auto');
  num(layout, 'micro-batch-size', 'micro batch size');
  num(layout, 'micro-batches', 'micro-batches');
  num(layout, 'virtual-stages', 'virtual stages');
  const recompute = field(layout, 'recompute', 'recompute', 'select');
  const attention = field(layout, 'attention', 'attention', 'select');
  attention.parentNode.classList.add('kept');
  checkbox(layout, 'sequence-parallel', 'sequence parallel');

  const batch = el(form, 'fieldset');
  el(batch, 'legend', {}, 'Batch and search');
  num(batch, 'global-batch-size', 'global batch size');
  const seqLen = num(batch, 'seq-len', 'sequence length');
  const search = checkbox(batch, 'search', 'search every layout (needs a global batch size)');
  const top = num(batch, 'top', 'layouts shown');
  top.value = '10';
  const searchNote = el(layout, 'p', { className: 'note search-note' }, 'A search tries every layout: of these it keeps the attention core only.');
  const searchChanged = () => { layout.classList.toggle('searching', search.checked); searchNote.hidden = !search.checked; top.disabled = !search.checked; };
  search.addEventListener('change', searchChanged);
  searchChanged();
  const runBtn = el(batch, 'button', { type: 'submit', id: 'run' }, 'plan');
  const status = el(batch, 'span', { id: 'status' });

  el(root, 'div', { id: 'error', role: 'alert' });
  const compare = el(el(root, 'div', { id: 'compare-wrap' }), 'table', { id: 'compare' });
  const results = el(root, 'div', { id: 'results' });

  // The model: a preset, or a config.json that overrides it while loaded.
  presetSel.addEventListener('change', () => {
    const p = presets.find((x) => x.name === presetSel.value);
    seqLen.placeholder = p && p.seq_len ? String(p.seq_len) : 'auto';
  });
  function clearHf(keepError, keepInput) {
    hfConfig = null; hfName = '';
    if (!keepInput) fileInput.value = '';
    hfStatus.hidden = true;
    if (!keepError) hfError.textContent = '';
  }
  function loadFile(file) {
    clearHf(false, true);
    if (!file) return Promise.resolve();
    if (limits.max_body_bytes && file.size > limits.max_body_bytes) {
      hfError.textContent = file.name + ' is ' + file.size + ' bytes, over the server\'s ' + limits.max_body_bytes + '.';
      return Promise.resolve();
    }
    pendingRead = new Promise((resolve) => {
      const reader = new FileReader();
      reader.onload = () => {
        let j;
        try { j = JSON.parse(reader.result); } catch (e) { j = e; }
        if (j instanceof Error || !isObject(j)) {
          clearHf(true);
          hfError.textContent = j instanceof Error ? file.name + ' is not JSON: ' + j.message : file.name + ' holds ' + (Array.isArray(j) ? 'an array' : 'a ' + typeof j) + ', not a config.json\'s object.';
        } else {
          hfConfig = j; hfName = file.name;
          hfText.textContent = 'model_type ' + (j.model_type || '(none)') + ' from ' + file.name + ' (used instead of the preset) ';
          hfStatus.hidden = false;
        }
        resolve();
      };
      reader.onerror = () => { hfError.textContent = 'could not read ' + file.name + '.'; resolve(); };
      reader.readAsText(file);
    });
    return pendingRead;
  }
  fileInput.addEventListener('change', () => loadFile(fileInput.files[0]));
  hfClear.addEventListener('click', () => clearHf());
  drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('over'); });
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (e) => {
    e.preventDefault();
    drop.classList.remove('over');
    if (e.dataTransfer.files.length) loadFile(e.dataTransfer.files[0]);
  });
  // A file dropped beside the zone does not replace the page.
  window.addEventListener('dragover', (e) => e.preventDefault());
  window.addEventListener('drop', (e) => e.preventDefault());

  // The request: only what was given.
  function intOf(id, name, min) {
    const input = $(id);
    const text = input.value.trim();
    if (input.validity && input.validity.badInput) throw new Error(name + ': not a number');
    if (text === '') return undefined;
    const v = Number(text);
    if (!Number.isInteger(v) || v < min) throw new Error(name + ' must be a whole number of at least ' + min + ' (or blank)');
    return v;
  }
  function request() {
    const req = {};
    if (hfConfig) req.hf_config = hfConfig;
    else if (presetSel.value) req.preset = presetSel.value;
    else throw new Error('Choose a preset or load a Hugging Face config.json.');
    if (cluster.value.trim()) req.cluster = cluster.value.trim();
    if (precision.value) req.precision = precision.value;
    const l = {};
    req.layout = l;
    req.search = search.checked;
    if (search.checked) {
      // A search tries every layout: of the layout's fields it takes the attention core only.
      if (attention.value) l.attention = attention.value;
    } else {
      layoutFields(l);
    }
    const gbs = intOf('global-batch-size', 'global batch size', 1);
    if (gbs !== undefined) req.global_batch_size = gbs;
    const seq = intOf('seq-len', 'sequence length', 1);
    if (seq !== undefined) req.seq_len = seq;
    if (search.checked) {
      if (gbs === undefined) throw new Error('A search of every layout needs a global batch size.');
      const t = intOf('top', 'layouts shown', 1);
      if (t !== undefined) req.top = t;
    }
    return req;
  }
  function layoutFields(l) {
    [['tp', 'tp'], ['pp', 'pp'], ['cp', 'cp'], ['ep', 'ep'], ['micro-batch-size', 'micro_batch_size'], ['micro-batches', 'micro_batches'],
      ['virtual-stages', 'virtual_stages']].forEach(([id, key]) => { const v = intOf(id, id.replace(/-/g, ' '), 1); if (v !== undefined) l[key] = v; });
    if ($('zero').value !== '') l.zero = Number($('zero').value);
    if (recompute.value) l.recompute = recompute.value;
    if ($('sequence-parallel').checked) l.sequence_parallel = true;
    if (attention.value) l.attention = attention.value;
  }

  async function run() {
    if (runBtn.disabled) return;
    showError('');
    if (pendingRead) await pendingRead;
    let req;
    try { req = request(); } catch (e) { showError(e.message); return; }
    const what = { model: hfConfig ? (hfConfig.model_type || 'config') + ' (' + hfName + ')' : req.preset, cluster: req.cluster, search: req.search };
    runBtn.disabled = true;
    const t0 = Date.now();
    const tick = () => { status.textContent = 'planning… ' + Math.floor((Date.now() - t0) / 1000) + ' s'; };
    tick();
    const timer = setInterval(tick, 1000);
    try {
      const r = await fetch('/api/plan', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(req) });
      const text = await r.text();
      let doc = null;
      try { doc = JSON.parse(text); } catch (e) { doc = null; }
      if (r.status !== 200 || !isObject(doc)) {
        failures += 1;
        body.dataset.failures = String(failures);
        showError(doc && doc.error ? String(doc.error) : 'The server answered ' + r.status + (text ? ': ' + text.split('\n')[0].slice(0, 300) : '') + '.');
        status.textContent = '';
        return;
      }
      status.textContent = 'answered in ' + ((Date.now() - t0) / 1000).toFixed(1) + ' s';
      addAnswer(what, doc);
    } catch (e) {
      failures += 1;
      body.dataset.failures = String(failures);
      showError('No answer from meshsim serve: ' + e.message);
      status.textContent = '';
    } finally {
      clearInterval(timer);
      runBtn.disabled = false;
    }
  }
  form.addEventListener('submit', (e) => { e.preventDefault(); run(); });

  // The answers.
  const fmt = () => window.MeshsimPlan.format;
  function cardTitle(n, what, doc) {
    const p = doc.plan;
    const clusterName = what.cluster || (p && p.cluster ? p.cluster.split(' (')[0] : '') || (doc.search && doc.search.cluster ? doc.search.cluster.split(' (')[0] : '');
    const parts = ['#' + n, what.model || (p && (p.preset || p.model)) || 'model', clusterName];
    if (p) parts.push(window.MeshsimPlan.layoutShort(p.layout));
    if (what.search) parts.push('search' + (doc.search ? ' of ' + (doc.search.candidates || 0) + ' layouts' : ''));
    return parts.filter((x) => x).join(' · ');
  }
  function addAnswer(what, doc) {
    answers += 1;
    const n = answers;
    const card = el(null, 'article', { className: 'card' });
    card.dataset.answer = String(n);
    results.insertBefore(card, results.firstChild);
    const title = cardTitle(n, what, doc);
    const head = el(card, 'header');
    el(head, 'h2', {}, title);
    const close = el(head, 'button', { type: 'button', className: 'close', title: 'close' }, '×');
    if (typeof doc.seconds === 'number') el(card, 'p', { className: 'when' }, 'planned in ' + doc.seconds.toFixed(1) + ' s');
    const content = el(card, 'div', { className: 'plan' });
    const entry = { n, card, title, doc, charts: 0 };
    kept.unshift(entry);
    try {
      if (!window.MeshsimPlan) throw new Error('plan.js is not loaded');
      entry.charts = window.MeshsimPlan.render(content, { title, plan: doc.plan || null, search: doc.search || null, command: doc.command }, { compact: true });
    } catch (e) {
      el(content, 'pre', { className: 'plan-errors' }, 'render: ' + e.message);
    }
    close.addEventListener('click', () => remove(entry));
    while (kept.length > KEEP) remove(kept[kept.length - 1], true);
    update();
  }
  function remove(entry, quiet) {
    const i = kept.indexOf(entry);
    if (i < 0) return;
    kept.splice(i, 1);
    if (window.MeshsimPlan) window.MeshsimPlan.destroy(entry.card);
    entry.card.remove();
    if (!quiet) update();
  }
  function update() {
    drawCompare();
    body.dataset.chartsRendered = String(kept.reduce((a, k) => a + k.charts, 0));
    body.dataset.answers = String(answers);
  }
  function drawCompare() {
    compare.textContent = '';
    compare.dataset.columns = String(kept.length);
    if (!kept.length || !window.MeshsimPlan) return;
    const f = fmt();
    const tr = el(el(compare, 'thead'), 'tr');
    el(tr, 'th', {}, '');
    kept.forEach((k) => el(tr, 'th', { className: 'answer', title: k.title }, k.title.split(' · ').slice(0, 3).join(' ') + (k.doc.search ? ' (search)' : '')));
    const rows = [
      ['step', (p) => f.seconds(p.step_seconds)],
      ['tokens/s/GPU', (p) => f.num(p.tokens_per_s_per_gpu, 0)],
      ['MFU', (p) => f.percent(p.mfu)],
      ['peak/GPU', (p) => f.bytes(window.MeshsimPlan.peakOf(p))],
      ['fits', (p) => (p.fits ? 'yes' : 'no')],
    ];
    const tb = el(compare, 'tbody');
    rows.forEach(([name, value]) => {
      const row = el(tb, 'tr');
      el(row, 'th', {}, name);
      kept.forEach((k) => el(row, 'td', {}, k.doc.plan ? value(k.doc.plan) : name === 'fits' ? 'no layout fits' : '–'));
    });
  }

  // The choices the server offers.
  (async function () {
    let doc = null, r = null;
    try {
      r = await fetch('/api/options');
      doc = JSON.parse(await r.text());
    } catch (e) {
      showError('Could not read /api/options: ' + e.message);
      return;
    }
    if (!r.ok || !isObject(doc)) { showError(doc && doc.error ? String(doc.error) : 'Could not read /api/options (' + r.status + ').'); return; }
    presets = doc.presets || [];
    limits = doc.limits || {};
    const count = window.MeshsimPlan ? window.MeshsimPlan.format.count : String;
    fillSelect(presetSel, presets.map((p) => ({ value: p.name, text: p.name + ' — ' + p.family + ', ' + count(p.parameters) + (p.experts ? ', ' + p.experts + ' experts' : '') })), 'choose…');
    (doc.clusters || []).forEach((c) => el(clusterList, 'option', { value: c }));
    const precisions = doc.precisions || ['bf16'];
    fillSelect(precision, precisions);
    precision.value = precisions.includes('bf16') ? 'bf16' : precisions[0];
    fillSelect(recompute, doc.recompute || [], 'auto');
    fillSelect(attention, doc.attention || [], 'auto');
    if (limits.max_seconds) intro.textContent += ' A plan stops after ' + limits.max_seconds + ' s.';
    body.dataset.ready = '1';
  })();
})();
