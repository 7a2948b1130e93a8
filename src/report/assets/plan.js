// The plan's renderer, shared by plan.html (written by `meshsim plan --out`) and the page
// `meshsim serve` answers at /. MeshsimPlan.render(container, data, options) draws one plan
// result ({title, plan, search, command}) into container with Chart.js and returns the number
// of charts drawn. In plan.html (which has #meshsim-data) the script renders into <main id="plan">,
// then sets <body data-charts-rendered="N">; an error shows in #plan-errors and counts in
// <body data-report-errors="N">, which the tests read.
'use strict';
window.MeshsimPlan = (function () {
  const CATEGORIES = ['parameters', 'gradients', 'optimizer', 'activations', 'communication', 'other'];
  const COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#bab0ac', '#b07aa1', '#edc948'];
  const KINDS = [
    { kind: 'compute', label: 'compute', color: '#4e79a7' },
    { kind: 'comm', label: 'exposed communication', color: '#f28e2b' },
    { kind: 'bubble', label: 'bubble (idle)', color: '#c9c9c9' },
  ];
  const GiB = 1024 * 1024 * 1024;
  let charts = 0; // canvases drawn on this page so far: each gets id chart-<what>-<n>

  function el(parent, tag, props, text) {
    const e = document.createElement(tag);
    Object.assign(e, props || {});
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmtBytes(b) {
    if (b === null || b === undefined || !isFinite(b)) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let v = Math.abs(b), u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
    return (b < 0 ? '-' : '') + (u === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : 1)) + ' ' + units[u];
  }
  function fmtNum(v, digits) {
    if (v === null || v === undefined) return '–';
    return typeof v === 'number' ? v.toLocaleString('en', { maximumFractionDigits: digits === undefined ? 4 : digits }) : String(v);
  }
  const fmtSeconds = (s) => (typeof s === 'number' ? s.toFixed(3) + ' s' : '–');
  const fmtPercent = (f) => (typeof f === 'number' ? (100 * f).toFixed(1) + '%' : '–');
  // 8030261248 → "8.0B"; 671026419200 → "671B".
  function shortCount(n) {
    if (typeof n !== 'number') return '–';
    const steps = [[1e12, 'T'], [1e9, 'B'], [1e6, 'M'], [1e3, 'K']];
    for (const [size, unit] of steps)
      if (Math.abs(n) >= size) { const v = n / size; return v.toFixed(v >= 100 ? 0 : 1) + unit; }
    return String(n);
  }
  // An assumption's value: bytes as bytes, integers with separators, fractions to 4 digits.
  function fmtValue(v, key) {
    if (v === null || v === undefined) return '–';
    if (typeof v === 'boolean') return v ? 'yes' : 'no';
    if (typeof v === 'number') {
      if (/bytes_per_s/.test(key || '')) return fmtBytes(v) + '/s';
      if (/bytes/.test(key || '')) return fmtBytes(v) + ' (' + v.toLocaleString('en') + ')';
      if (Number.isInteger(v)) return v.toLocaleString('en');
      const a = Math.abs(v);
      return a >= 1e-3 && a < 1e9 ? String(Number(v.toPrecision(4))) : v.toExponential(3);
    }
    if (Array.isArray(v)) return v.map((x) => (typeof x === 'object' && x !== null ? JSON.stringify(x) : fmtValue(x, key))).join(', ');
    if (typeof v === 'object') return JSON.stringify(v);
    return String(v);
  }
  const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

  function table(parent, head, rows, props) {
    const wrap = el(parent, 'div', { className: 'table-wrap' });
    const t = el(wrap, 'table', props);
    if (head) {
      const tr = el(el(t, 'thead'), 'tr');
      head.forEach((h) => el(tr, 'th', {}, h));
    }
    const tb = el(t, 'tbody');
    rows.forEach((r) => { const row = el(tb, 'tr'); r.forEach((c) => el(row, 'td', {}, c)); });
    return t;
  }
  function section(parent, title, note) {
    const s = el(parent, 'section');
    el(s, 'h2', {}, title);
    if (note) el(s, 'p', { className: 'note' }, note);
    return s;
  }
  function newCanvas(parent, what, height) {
    charts += 1;
    const box = el(parent, 'div', { className: 'chart' });
    box.style.height = height + 'px';
    return el(box, 'canvas', { id: 'chart-' + what + '-' + charts });
  }
  function draw(cv, config) {
    if (typeof Chart === 'undefined') throw new Error('Chart.js is not loaded');
    config.options = Object.assign({ animation: false, responsive: true, maintainAspectRatio: false }, config.options);
    return new Chart(cv, config);
  }

  // "tp 2 · pp 1 · ..." (long) or "tp2 pp1 dp4 zero1 mbs1" (short) from a plan's layout.
  function layoutLong(l) {
    if (!l || l.tp === undefined) return '–';
    const parts = [
      'tp ' + l.tp, 'pp ' + l.pp, 'cp ' + l.cp + (l.cp > 1 && l.cp_comm ? ' (' + l.cp_comm + ')' : ''), 'ep ' + l.ep, 'dp ' + l.dp,
      'zero ' + l.zero, 'micro batch size ' + l.micro_batch_size, l.micro_batches + ' micro-batch' + (l.micro_batches === 1 ? '' : 'es'),
      'recompute ' + l.recompute, 'sequence parallel ' + (l.sequence_parallel ? 'on' : 'off'), 'virtual stages ' + l.virtual_stages,
    ];
    if (l.attention) parts.push('attention ' + l.attention);
    if (Array.isArray(l.stage_layers) && l.stage_layers.length) parts.push('layers by stage ' + l.stage_layers.join('/'));
    return parts.join(' · ');
  }
  function layoutShort(l) {
    if (!l) return '';
    const parts = ['tp' + l.tp, 'pp' + l.pp];
    if (l.cp > 1) parts.push('cp' + l.cp);
    if (l.ep > 1) parts.push('ep' + l.ep);
    parts.push('dp' + l.dp, 'zero' + l.zero, 'mbs' + l.micro_batch_size);
    if (l.recompute && l.recompute !== 'none') parts.push('rc ' + l.recompute);
    return parts.join(' ');
  }
  const peakOf = (plan) => (plan && Array.isArray(plan.stages) && plan.stages.length ? Math.max(...plan.stages.map((s) => s.peak_bytes)) : null);
  const stageLabel = (s) => 'stage ' + s.stage + (s.tp_rank !== undefined && s.tp_rank !== null ? ', tp rank ' + s.tp_rank : '');

  function headSection(parent, d, p, label) {
    const sec = section(parent, label || 'The plan');
    const l = p.layout || {};
    const model = (p.preset || p.model || 'model') + (p.preset && p.model && p.model !== p.preset ? ' (' + p.model + ')' : '');
    const rows = [
      ['model', model + ', ' + shortCount(p.parameters) + ' parameters'],
      ['cluster', p.cluster || '–'],
      ['layout', layoutLong(l)],
      ['precision', p.precision || '–'],
      ['global batch', fmtNum(p.global_batch_size, 0) + ' sequences a step'],
    ];
    if (p.routing) rows.push(['routing', String(p.routing)]);
    table(sec, null, rows, { className: 'summary' });
    const peak = peakOf(p);
    const fig = el(sec, 'div', { id: 'plan-summary', className: 'figures plan-summary' });
    fig.dataset.stepSeconds = String(p.step_seconds);
    fig.dataset.peakBytes = String(peak);
    fig.dataset.fits = String(!!p.fits);
    const tile = (name, value, cls) => {
      const t = el(fig, 'div', { className: 'figure ' + (cls || '') });
      el(t, 'div', { className: 'value' }, value);
      el(t, 'div', { className: 'name' }, name);
    };
    tile('predicted step', fmtSeconds(p.step_seconds));
    tile('tokens/s per GPU', fmtNum(p.tokens_per_s_per_gpu, 0));
    tile('TFLOP/s per GPU', fmtNum(p.tflops_per_gpu, 1));
    tile('MFU', fmtPercent(p.mfu));
    tile('peak memory per GPU', fmtBytes(peak) + ' of ' + fmtBytes(p.gpu_memory_bytes));
    tile('fits', p.fits ? 'yes' : 'no', p.fits ? 'good' : 'bad');
  }

  // A dashed vertical line at the GPU's capacity across a horizontal bar chart.
  const capacityLine = (value, text) => ({
    id: 'capacityLine',
    afterDatasetsDraw(c) {
      const x = c.scales.x.getPixelForValue(value), area = c.chartArea;
      if (x < area.left || x > area.right) return;
      const ctx = c.ctx;
      ctx.save();
      ctx.strokeStyle = '#000';
      ctx.setLineDash([6, 4]);
      ctx.beginPath(); ctx.moveTo(x, area.top); ctx.lineTo(x, area.bottom); ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = '#000';
      ctx.font = '11px system-ui, sans-serif';
      ctx.textAlign = x > area.left + (area.right - area.left) * 0.7 ? 'right' : 'left';
      ctx.fillText(text, x + (ctx.textAlign === 'right' ? -4 : 4), area.top + 10);
      ctx.restore();
    },
  });

  function memorySection(parent, p, compact) {
    const stages = p.stages || [];
    const sec = section(parent, 'Memory per GPU', 'The peak of each stage\'s GPU by category; the dashed line is the GPU\'s memory (' + fmtBytes(p.gpu_memory_bytes) + ').');
    if (!stages.length) { el(sec, 'p', {}, 'The plan has no stage.'); return 0; }
    const cats = CATEGORIES.slice();
    stages.forEach((s) => Object.keys(s.peak_by_category || {}).forEach((c) => { if (!cats.includes(c)) cats.push(c); }));
    const labels = stages.map(stageLabel);
    const cap = p.gpu_memory_bytes;
    const peak = peakOf(p);
    const cv = newCanvas(sec, 'memory', Math.max(compact ? 150 : 180, 70 + 28 * stages.length));
    draw(cv, {
      type: 'bar',
      data: { labels, datasets: cats.map((c, i) => ({ label: c, data: stages.map((s) => ((s.peak_by_category || {})[c] || 0) / GiB), backgroundColor: COLORS[i % COLORS.length] })) },
      options: {
        indexAxis: 'y',
        plugins: { tooltip: { mode: 'index', filter: (it) => it.raw > 0, callbacks: {
          title: (items) => (items.length ? items[0].label + ': peak ' + fmtBytes(stages[items[0].dataIndex].peak_bytes) : ''),
          label: (it) => it.dataset.label + ': ' + fmtBytes(it.raw * GiB) } } },
        scales: {
          x: { stacked: true, beginAtZero: true, suggestedMax: cap > 0 ? Math.max(cap, peak) * 1.05 / GiB : undefined, title: { display: true, text: 'GiB' } },
          y: { stacked: true },
        },
      },
      plugins: cap > 0 ? [capacityLine(cap / GiB, 'GPU ' + fmtBytes(cap))] : [],
    });
    table(sec, ['', ...cats, 'peak', 'of the GPU'], stages.map((s, i) => [labels[i], ...cats.map((c) => fmtBytes((s.peak_by_category || {})[c] || 0)),
      fmtBytes(s.peak_bytes), cap > 0 ? (100 * s.peak_bytes / cap).toFixed(1) + '%' : '–']), { className: 'numbers' });
    return 1;
  }

  function timelineSection(parent, p, compact) {
    const t = p.timeline;
    if (!t || !Array.isArray(t.stages) || !t.stages.length) {
      el(section(parent, 'The step'), 'p', { className: 'note' }, 'This plan has no timeline of its step.');
      return 0;
    }
    const step = t.step_seconds || p.step_seconds;
    const ms = step < 1;
    const scale = ms ? 1e3 : 1, unit = ms ? 'ms' : 's';
    const sec = section(parent, 'The step, ' + fmtSeconds(step), 'Each stage\'s GPU over the predicted step: computing, waiting on communication it could not hide, or idle in the pipeline\'s bubble.');
    const labels = t.stages.map((s) => 'stage ' + s.stage + (s.rank !== undefined ? ' · GPU ' + s.rank : ''));
    const datasets = KINDS.map((k) => ({
      label: k.label, backgroundColor: k.color, grouped: false, barPercentage: 0.9, categoryPercentage: 0.9,
      data: t.stages.flatMap((s, i) => (s.segments || []).filter((g) => g[2] === k.kind).map((g) => ({ x: [g[0] * scale, g[1] * scale], y: labels[i] }))),
    }));
    const cv = newCanvas(sec, 'timeline', Math.max(compact ? 140 : 170, 70 + 30 * t.stages.length));
    draw(cv, {
      type: 'bar',
      data: { labels, datasets },
      options: {
        indexAxis: 'y',
        plugins: { tooltip: { callbacks: { label: (it) => {
          const [a, b] = it.raw.x;
          return it.dataset.label + ': ' + a.toFixed(3) + '–' + b.toFixed(3) + ' ' + unit + ' (' + (b - a).toFixed(3) + ' ' + unit + ')';
        } } } },
        scales: { x: { type: 'linear', min: 0, max: step * scale, title: { display: true, text: unit + ' into the step' } }, y: { type: 'category' } },
      },
    });
    const pc = (x) => (typeof x === 'number' ? x.toFixed(3) + ' s (' + (step > 0 ? (100 * x / step).toFixed(1) : '–') + '%)' : '–');
    if (t.overlap_penalty_seconds > 0) el(sec, 'p', { className: 'note' }, 'Compute slowed beside the communication it hides: the step adds ' + fmtSeconds(t.overlap_penalty_seconds) + ' (the overlap penalty).');
    table(sec, ['', 'compute', 'exposed communication', 'bubble'], t.stages.map((s, i) => [labels[i], pc(s.compute_s), pc(s.exposed_comm_s), pc(s.bubble_s)]), { className: 'numbers' });
    return 1;
  }

  function assumptionsSection(parent, p) {
    const a = p.assumptions;
    if (!isObject(a) || !Object.keys(a).length) return;
    const sec = section(parent, 'Assumptions', 'What the prediction takes as given.');
    const rows = [];
    // Nested objects flattened: "efficiencies.matmul", "links.intra.gb_per_s".
    const add = (prefix, v, key, depth) => {
      if (isObject(v) && depth < 4) Object.keys(v).forEach((k) => add(prefix ? prefix + '.' + k : k, v[k], k, depth + 1));
      else rows.push([prefix, fmtValue(v, key)]);
    };
    add('', a, '', 0);
    table(sec, null, rows, { className: 'summary defs' });
  }

  function searchSection(parent, d, s) {
    const sec = section(parent, 'The search', 'Every layout of ' + (s.preset || s.model || 'the model') + ' on ' + (s.cluster || 'the cluster') +
      ' for a global batch of ' + fmtNum(s.global_batch_size, 0) + ', ranked by predicted tokens/s per GPU. A row not planned in full is an estimate, carried on from small plans of its layout.');
    table(sec, null, [
      ['candidates', fmtNum(s.candidates, 0)], ['invalid', fmtNum(s.invalid, 0)], ['planned in full', fmtNum(s.planned, 0)],
      ['fitting', fmtNum(s.fitting, 0)], ['searched in', fmtNum(s.seconds, 1) + ' s'],
    ], { className: 'summary' });
    const layouts = s.layouts || [];
    if (!layouts.length) el(sec, 'p', { className: 'bad no-fit' }, 'No layout fits.');
    else {
      const chosen = layouts.findIndex((x) => x.planned_in_full);
      const t = table(sec, ['#', 'tp', 'cp', 'pp', 'dp', 'ep', 'zero', 'mbs', 'micro-batches', 'recompute', 'sp', 'step s', 'tokens/s/GPU', 'TFLOP/s', 'MFU', 'peak/GPU', 'planned in full'],
        layouts.map((x, i) => {
          const l = x.layout || {};
          return [String(x.rank !== undefined ? x.rank : i + 1), l.tp, l.cp, l.pp, l.dp, l.ep, l.zero, l.micro_batch_size, l.micro_batches, l.recompute,
            l.sequence_parallel ? 'on' : 'off', typeof x.step_seconds === 'number' ? x.step_seconds.toFixed(3) : '–', fmtNum(x.tokens_per_s_per_gpu, 0),
            fmtNum(x.tflops_per_gpu, 1), fmtPercent(x.mfu), fmtBytes(x.peak_bytes), x.planned_in_full ? 'yes' : 'estimated'].map((v) => (v === undefined ? '–' : String(v)));
        }), { id: 'search-table', className: 'numbers search-table' });
      if (chosen >= 0 && d.plan) t.tBodies[0].rows[chosen].className = 'chosen';
    }
    const rejected = s.rejected || [];
    if (!rejected.length) el(sec, 'p', { className: 'note' }, 'Every family has a layout that fits.');
    else {
      el(sec, 'h3', {}, 'Families with no layout that fits');
      table(sec, ['family', 'reason', 'candidates'], rejected.map((r) => [r.family, r.reason, fmtNum(r.candidates, 0)]), { id: 'rejected-table', className: 'rejected-table' });
    }
  }

  function commandSection(parent, command) {
    const sec = section(parent, 'The same plan from the command line');
    el(el(sec, 'pre', { className: 'command' }), 'code', {}, command);
  }

  // Draws data into container; errors go to options.onError(text) (else a note in the
  // container). Returns the number of charts drawn.
  function render(container, data, options) {
    const opts = options || {};
    const d = data || {};
    let drawn = 0;
    const fail = opts.onError || ((text) => {
      const box = container.querySelector('.plan-errors') || el(container, 'pre', { className: 'plan-errors' });
      box.textContent += text + '\n';
    });
    const step = (name, f) => { try { drawn += f() || 0; } catch (e) { fail(name + ': ' + e.message); } };
    if (d.title && !opts.compact) el(container, 'h1', {}, d.title);
    const p = d.plan, s = d.search;
    if (s) step('search', () => searchSection(container, d, s));
    if (p) {
      step('summary', () => headSection(container, d, p, s ? 'The fastest layout, planned in full' : null));
      step('memory', () => memorySection(container, p, opts.compact));
      step('timeline', () => timelineSection(container, p, opts.compact));
      step('assumptions', () => assumptionsSection(container, p));
    } else if (!s) {
      el(section(container, 'No plan'), 'p', { className: 'bad' }, 'There is no plan to show.');
    }
    if (d.command) step('command', () => commandSection(container, d.command));
    return drawn;
  }

  // Destroys the charts inside container (before it leaves the page).
  function destroy(container) {
    if (typeof Chart === 'undefined') return;
    container.querySelectorAll('canvas').forEach((c) => { const ch = Chart.getChart(c); if (ch) ch.destroy(); });
  }

  return { render, destroy, layoutShort, peakOf, el, format: { bytes: fmtBytes, num: fmtNum, seconds: fmtSeconds, percent: fmtPercent, count: shortCount } };
})();

// plan.html: the data is in #meshsim-data.
(function () {
  const source = document.getElementById('meshsim-data');
  if (!source) return;
  const body = document.body;
  let errors = 0;
  function showError(text) {
    errors += 1;
    body.dataset.reportErrors = String(errors);
    let box = document.getElementById('plan-errors');
    if (!box) {
      box = document.createElement('pre');
      box.id = 'plan-errors';
      body.insertBefore(box, body.firstChild);
    }
    box.textContent += text + '\n';
  }
  window.addEventListener('error', (e) => showError('error: ' + e.message));
  try {
    const d = JSON.parse(source.textContent);
    const main = document.getElementById('plan') || document.body.appendChild(document.createElement('main'));
    body.dataset.chartsRendered = String(window.MeshsimPlan.render(main, d, { onError: showError }));
  } catch (e) {
    showError('plan: ' + e.message);
  }
})();
