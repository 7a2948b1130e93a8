// report.html's script: builds the page from the JSON in #meshsim-data with Chart.js (inline
// before this script). When every chart is drawn, <body data-charts-rendered="N">; an error
// anywhere shows on the page and counts in <body data-report-errors="N">, which the tests read.
'use strict';
(function () {
  const body = document.body;
  let errors = 0;
  function showError(text) {
    errors += 1;
    body.dataset.reportErrors = String(errors);
    const box = document.getElementById('report-errors') || el(body, 'pre', { id: 'report-errors' });
    box.textContent += text + '\n';
  }
  window.addEventListener('error', (e) => showError('error: ' + e.message));

  const COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#bab0ac'];
  const OP_COLORS = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#b07aa1', '#edc948', '#9c755f', '#ff9da7', '#76b7b2'];
  const charts = {};
  let drawn = 0;

  function el(parent, tag, props, text) {
    const e = document.createElement(tag);
    Object.assign(e, props || {});
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e);
    return e;
  }
  function fmtBytes(b) {
    if (b === null || b === undefined) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = Math.abs(b), u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
    return (b < 0 ? '-' : '') + (u === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : 1)) + ' ' + units[u];
  }
  function fmtNum(v, digits) {
    if (v === null || v === undefined) return '–';
    return typeof v === 'number' ? v.toLocaleString('en', { maximumFractionDigits: digits === undefined ? 4 : digits }) : String(v);
  }
  function section(title, note) {
    const s = el(document.getElementById('report'), 'section');
    el(s, 'h2', {}, title);
    if (note) el(s, 'p', { className: 'note' }, note);
    return s;
  }
  function canvas(parent, name, cls) {
    const box = el(parent, 'div', { className: 'chart ' + (cls || '') });
    return el(box, 'canvas', { id: 'chart-' + name });
  }
  // Every chart is drawn at once (no animation), so the page is complete when this returns.
  function chart(name, cv, config) {
    if (charts[name]) charts[name].destroy(); else drawn += 1;
    config.options = Object.assign({ animation: false, responsive: true, maintainAspectRatio: false }, config.options);
    charts[name] = new Chart(cv, config);
    return charts[name];
  }
  function table(parent, head, rows) {
    const t = el(parent, 'table');
    const tr = el(el(t, 'thead'), 'tr');
    head.forEach((h) => el(tr, 'th', {}, h));
    const tb = el(t, 'tbody');
    rows.forEach((r) => { const row = el(tb, 'tr'); r.forEach((c) => el(row, 'td', {}, c)); });
    return t;
  }
  const bytesAxis = (title) => ({ stacked: true, beginAtZero: true, title: { display: true, text: title }, ticks: { callback: (v) => fmtBytes(v) } });
  const sum = (a) => a.reduce((x, y) => x + y, 0);
  function gpuList(ids) {
    if (ids.length === 1) return 'GPU ' + ids[0];
    const run = ids.every((g, i) => i === 0 || g === ids[i - 1] + 1);
    return 'GPUs ' + (run ? ids[0] + '–' + ids[ids.length - 1] : ids.length <= 6 ? ids.join(', ') : ids.slice(0, 4).join(', ') + ', … ' + ids[ids.length - 1]);
  }

  function summarySection(d) {
    const s = d.summary, l = s.layout || {};
    const sec = section('Summary');
    const rows = [
      ['status', s.status + (s.error ? ': ' + s.error : '')],
      ['strategy', s.strategy + ' on ' + s.world_size + ' virtual GPUs (' + s.device + ')'],
      ['layout', 'dp ' + l.dp + (l.cp > 1 ? ' × cp ' + l.cp : '') + ' × tp ' + l.tp + ' × pp ' + l.pp + (l.ep > 1 ? ', ep ' + l.ep : '') + ', zero ' + l.zero + (l.pp > 1 ? ', ' + l.schedule + ' schedule' : '') + ', ' + l.micro_batches + ' micro-batches, recompute ' + l.recompute],
      ['model', s.model + ' (' + fmtNum(s.parameters, 0) + ' parameters)'],
      ['batch', s.batch_size + ' per replica, ' + s.global_batch_size + ' global'],
      ['steps', fmtNum(s.steps, 0)],
      ['final loss', fmtNum(s.final_loss)],
      ['test accuracy', s.test_accuracy === undefined ? '–' : (100 * s.test_accuracy).toFixed(2) + '% of ' + s.test_samples],
      ['time', fmtNum(s.wall_seconds, 2) + ' s wall, ' + fmtNum(s.train_seconds, 2) + ' s training'],
      ['peak memory', s.gpus ? fmtBytes(Math.max(...s.gpus.map((g) => g.peak_bytes))) + ' (the most any GPU held)' : '–'],
    ];
    table(sec, ['', ''], rows).className = 'summary';
  }

  function trainingSection(d) {
    const sec = section('Training', d.metrics.length ? 'Each point is a logged step (metrics.jsonl).' : 'No step was logged.');
    if (!d.metrics.length) return;
    const row = el(sec, 'div', { className: 'row' });
    const line = (name, title, col, color) => chart(name, canvas(row, name, 'half'), {
      type: 'line',
      data: { datasets: [{ label: title, data: d.metrics.filter((m) => m[col] !== null).map((m) => ({ x: m[0], y: m[col] })), borderColor: color, backgroundColor: color, pointRadius: d.metrics.length > 200 ? 0 : 2 }] },
      options: { parsing: true, interaction: { mode: 'nearest', axis: 'x', intersect: false }, scales: { x: { type: 'linear', title: { display: true, text: 'step' } }, y: { title: { display: true, text: title } } } },
    });
    line('loss', 'loss', 1, '#4e79a7');
    line('throughput', 'samples/s', 2, '#59a14f');
  }

  function memorySection(d) {
    const m = d.memory, cats = d.categories;
    const sec = section('Memory', 'Every virtual GPU\'s bytes by category. Identical GPUs are drawn once. Samples are taken at phase boundaries (batch, forward, backward, each bucket\'s collective, optimizer, pipeline actions); hover for bytes by category.');
    if (!m.groups.length || !Object.keys(m.detail).length) { el(sec, 'p', {}, 'No memory sample was taken.'); return; }
    const controls = el(sec, 'div', { className: 'controls' });
    el(controls, 'label', { htmlFor: 'gpu-select' }, 'GPU ');
    const gpuSel = el(controls, 'select', { id: 'gpu-select' });
    m.groups.forEach((ids, i) => el(gpuSel, 'option', { value: String(i) }, gpuList(ids) + (ids.length > 1 ? ' (' + ids.length + ' identical)' : '')));
    el(controls, 'label', { htmlFor: 'step-select' }, ' step ');
    const stepSel = el(controls, 'select', { id: 'step-select' });
    const steps = Object.keys(m.detail).map(Number).sort((a, b) => a - b);
    steps.forEach((s) => el(stepSel, 'option', { value: String(s) }, 'step ' + s + (s === m.representative_step ? ' (representative)' : '')));
    stepSel.value = String(m.representative_step in m.detail ? m.representative_step : steps[steps.length - 1]);
    const prev = el(controls, 'button', { type: 'button' }, '◀'), next = el(controls, 'button', { type: 'button' }, '▶');
    const stepNote = el(sec, 'p', { className: 'note' });
    const stepCanvas = canvas(sec, 'memory-step', 'tall');
    el(sec, 'h3', {}, 'Peak of every GPU');
    const peakNote = el(sec, 'p', { className: 'note' }, 'Bars: the sampled moment each GPU held the most, by category; grey: the allocator\'s peak above it (reached between samples). Click a bar to show that GPU above.');
    const peakCanvas = canvas(sec, 'memory-peaks');
    const stripTitle = el(sec, 'h3');
    el(sec, 'p', { className: 'note' }, 'Each column: the most the GPU held in that step (or range of steps). Click a column to show its step above.');
    const stripCanvas = canvas(sec, 'memory-strip', 'short');

    function drawStep() {
      const g = Number(gpuSel.value), step = Number(stepSel.value), rows = m.detail[String(step)][g];
      const cap = m.peaks[m.groups[g][0]].capacity, top = Math.max(...rows.map((r) => sum(r.slice(2))));
      // One point per change of the GPU's bytes, named by the phase boundary it was sampled at.
      const datasets = cats.map((c, i) => ({
        label: c, data: rows.map((r) => r[2 + i]),
        borderColor: COLORS[i], backgroundColor: COLORS[i] + 'b0', fill: i === 0 ? 'origin' : '-1', pointRadius: 2, borderWidth: 1, stack: 'bytes',
      }));
      const capShown = cap > 0 && cap <= 1.5 * top;
      if (capShown) datasets.push({ label: 'capacity', data: rows.map(() => cap), borderColor: '#000', borderDash: [6, 4], pointRadius: 0, fill: false, stack: 'capacity' });
      stepNote.textContent = gpuList(m.groups[g]) + ', step ' + step + ': ' + rows.length + ' points, peak ' + fmtBytes(top) + '; capacity ' + fmtBytes(cap) + (capShown ? ' (dashed)' : ' (off scale)') + '.';
      chart('memory-step', stepCanvas, {
        type: 'line', data: { labels: rows.map((r) => m.phases[r[1]]), datasets },
        options: {
          interaction: { mode: 'index', intersect: false },
          plugins: { tooltip: { filter: (it) => it.dataset.stack === 'bytes' && it.raw > 0, callbacks: {
            title: (items) => items.length ? items[0].label + ' (' + rows[items[0].dataIndex][0].toFixed(3) + ' ms into the step)' : '',
            label: (it) => it.dataset.label + ': ' + fmtBytes(it.raw),
            footer: (items) => items.length ? 'total ' + fmtBytes(sum(rows[items[0].dataIndex].slice(2))) : '' } } },
          scales: { x: { title: { display: true, text: 'step ' + step + ': each point a phase boundary where the GPU\'s bytes changed' } }, y: bytesAxis('bytes') },
        },
      });
    }
    function drawStrip() {
      const g = Number(gpuSel.value), cols = m.strip[g];
      stripTitle.textContent = 'The run: ' + gpuList(m.groups[g]) + ', peak per step';
      chart('memory-strip', stripCanvas, {
        type: 'bar',
        data: { labels: cols.map((c) => c[0] === c[1] ? String(c[0]) : c[0] + '–' + c[1]),
          datasets: cats.map((c, i) => ({ label: c, data: cols.map((r) => r[2 + i]), backgroundColor: COLORS[i], categoryPercentage: 1, barPercentage: 1 })) },
        options: {
          plugins: { legend: { display: false }, tooltip: { mode: 'index', filter: (it) => it.raw > 0, callbacks: { label: (it) => it.dataset.label + ': ' + fmtBytes(it.raw) } } },
          scales: { x: { stacked: true, title: { display: true, text: 'step' } }, y: bytesAxis('peak') },
          onClick: (e, items) => {
            if (!items.length) return;
            const [lo, hi] = cols[items[0].index];
            const s = steps.find((x) => x >= lo && x <= hi) ?? steps.reduce((a, b) => Math.abs(b - lo) < Math.abs(a - lo) ? b : a);
            stepSel.value = String(s); drawStep();
          },
        },
      });
    }
    const peaks = m.peaks;
    const between = peaks.map((p) => Math.max(0, p.peak - sum(p.sampled)));
    const peakSets = cats.map((c, i) => ({ label: c, data: peaks.map((p) => p.sampled[i]), backgroundColor: COLORS[i], stack: 'bytes' }));
    peakSets.push({ label: 'between samples', data: between, backgroundColor: '#dddddd', stack: 'bytes' });
    const topPeak = Math.max(...peaks.map((p) => p.peak)), caps = peaks.map((p) => p.capacity);
    if (caps.some((c) => c > 0 && c <= 1.5 * topPeak))
      peakSets.push({ type: 'line', label: 'capacity', data: caps, borderColor: '#000', borderDash: [6, 4], pointRadius: 0, stack: 'capacity' });
    else peakNote.textContent += ' Capacity ' + fmtBytes(Math.max(...caps)) + ' is off scale.';
    chart('memory-peaks', peakCanvas, {
      type: 'bar',
      data: { labels: peaks.map((p, i) => String(i)), datasets: peakSets },
      options: {
        plugins: { tooltip: { mode: 'index', filter: (it) => it.raw > 0, callbacks: {
          title: (items) => items.length ? 'GPU ' + items[0].label + ': peak ' + fmtBytes(peaks[items[0].dataIndex].peak) : '',
          label: (it) => it.dataset.label + ': ' + fmtBytes(it.raw) } } },
        scales: { x: { stacked: true, title: { display: true, text: 'GPU' } }, y: bytesAxis('bytes') },
        onClick: (e, items) => { if (items.length) { gpuSel.value = String(m.group_of[items[0].index]); drawStep(); drawStrip(); } },
      },
    });
    gpuSel.addEventListener('change', () => { drawStep(); drawStrip(); });
    stepSel.addEventListener('change', drawStep);
    const move = (by) => { const i = steps.indexOf(Number(stepSel.value)) + by; if (i >= 0 && i < steps.length) { stepSel.value = String(steps[i]); drawStep(); } };
    prev.addEventListener('click', () => move(-1));
    next.addEventListener('click', () => move(1));
    drawStep();
    drawStrip();
  }

  function sizeLabel(bin) { return bin < 0 ? '0 B' : fmtBytes(Math.pow(2, bin)) + '–' + fmtBytes(Math.pow(2, bin + 1)); }

  function collectivesSection(d) {
    const cs = d.collectives;
    const sec = section('Collectives', 'Each collective counted once per group (send/recv once, on the sender), every rank\'s records together.');
    if (!cs.length) { el(sec, 'p', {}, 'No collective was recorded (one GPU, or the run stopped before its records were gathered).'); return; }
    const ops = [...new Set(cs.map((c) => c.op))].sort();
    const byGroup = {};
    cs.forEach((c) => { byGroup[c.group] = (byGroup[c.group] || 0) + c.bytes; });
    const groups = Object.keys(byGroup).sort((a, b) => byGroup[b] - byGroup[a]);
    const shown = groups.slice(0, 24);
    const row = el(sec, 'div', { className: 'row' });
    const groupCanvas = canvas(row, 'collectives-groups', 'half');
    chart('collectives-groups', groupCanvas, {
      type: 'bar',
      data: { labels: shown, datasets: ops.map((op, i) => ({ label: op, backgroundColor: OP_COLORS[i % OP_COLORS.length],
        data: shown.map((g) => sum(cs.filter((c) => c.group === g && c.op === op).map((c) => c.bytes))) })) },
      options: { indexAxis: 'y', plugins: { title: { display: true, text: 'bytes by group' + (groups.length > shown.length ? ' (top ' + shown.length + ' of ' + groups.length + ')' : '') },
        tooltip: { callbacks: { label: (it) => it.dataset.label + ': ' + fmtBytes(it.raw) } } },
        scales: { x: { stacked: true, ticks: { callback: (v) => fmtBytes(v) } }, y: { stacked: true, title: { display: true, text: 'group (ranks)' } } } },
    });
    const bins = [...new Set(cs.flatMap((c) => c.sizes.map((s) => s[0])))].sort((a, b) => a - b);
    chart('collectives-sizes', canvas(row, 'collectives-sizes', 'half'), {
      type: 'bar',
      data: { labels: bins.map(sizeLabel), datasets: ops.map((op, i) => ({ label: op, backgroundColor: OP_COLORS[i % OP_COLORS.length],
        data: bins.map((b) => sum(cs.filter((c) => c.op === op).map((c) => sum(c.sizes.filter((s) => s[0] === b).map((s) => s[1]))))) })) },
      options: { plugins: { title: { display: true, text: 'calls by size (bytes per rank)' } }, scales: { x: { stacked: true }, y: { stacked: true, title: { display: true, text: 'calls' } } } },
    });
    const rows = cs.slice().sort((a, b) => b.bytes - a.bytes).slice(0, 200).map((c) => [c.group, String(c.ranks), c.op, fmtNum(c.calls, 0), fmtBytes(c.bytes), fmtBytes(c.bytes / c.calls), fmtNum(c.seconds * 1e3, 2)]);
    table(sec, ['group', 'ranks', 'op', 'calls', 'bytes', 'mean size', 'ms (measured)'], rows);
  }

  const palette = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];
  function routingSection(d) {
    const r = d.summary.routing;
    if (!r) return;
    const sec = section('Routing', 'A mixture of experts\' routing as the run recorded it (routing.csv has every step, rank and layer): the tokens sent to each expert over the run, each step\'s imbalance (the busiest expert\'s tokens over the mean: 1 is balanced), and each GPU\'s experts beside its memory peak.');
    const row = el(sec, 'div', { className: 'row' });
    chart('routing-tokens', canvas(row, 'routing-tokens', 'half'), {
      type: 'bar',
      data: { labels: Array.from({ length: r.experts }, (_, e) => 'expert ' + e),
        datasets: r.layers.map((layer, i) => ({ label: 'layer ' + layer, data: r.tokens_per_expert[layer], backgroundColor: palette[i % palette.length] })) },
      options: { scales: { y: { beginAtZero: true, title: { display: true, text: 'tokens over the run' } } } },
    });
    chart('routing-imbalance', canvas(row, 'routing-imbalance', 'half'), {
      type: 'line',
      data: { labels: r.steps, datasets: r.layers.map((layer, i) => ({ label: 'layer ' + layer, data: r.imbalance[layer], borderColor: palette[i % palette.length], pointRadius: 0 })) },
      options: { scales: { x: { title: { display: true, text: 'step' } }, y: { beginAtZero: true, title: { display: true, text: 'busiest expert ÷ mean' } } } },
    });
    const gpus = d.summary.gpus || [];
    // The hottest GPU is the one whose experts ran the most rows in one step: a step's
    // activations are what a peak holds, not the run's total.
    const loads = r.ranks.map((k) => k.most_rows_in_a_step);
    const most = Math.max(...loads), least = Math.min(...loads);
    table(sec, ['GPU', 'experts held', 'rows its experts ran', 'in its busiest step', 'peak memory', ''], r.ranks.map((k) => [
      String(k.rank), k.experts[0] === k.experts[1] ? String(k.experts[0]) : k.experts[0] + '–' + k.experts[1],
      fmtNum(k.rows_ran, 0), fmtNum(k.most_rows_in_a_step, 0), gpus[k.rank] ? fmtBytes(gpus[k.rank].peak_bytes) : '–',
      most !== least && k.most_rows_in_a_step === most ? 'hottest' : most !== least && k.most_rows_in_a_step === least ? 'coolest' : '',
    ]));
  }

  function predictionSection(d) {
    const p = d.prediction, s = d.summary;
    if (!p) return;
    const sec = section('Prediction on ' + p.cluster, 'The cost model\'s replay of step ' + p.step + ' on the target cluster (summary.json\'s "prediction").');
    const row = el(sec, 'div', { className: 'row' });
    const left = el(row, 'div', { className: 'half' });
    const measured = s.steps ? s.train_seconds / s.steps : null;
    table(left, ['', ''], [
      ['step time', fmtNum(p.step_time_s * 1e3, 3) + ' ms' + (measured ? ' (measured here: ' + fmtNum(measured * 1e3, 3) + ' ms)' : '')],
      ['throughput', fmtNum(p.samples_per_s, 1) + ' samples/s'],
      ['TFLOP/s per GPU', fmtNum(p.tflops_per_gpu, 2) + ' (MFU ' + (100 * p.mfu).toFixed(1) + '%, ' + p.dtype + ', ' + p.compute + ' compute)'],
      ['exposed communication', fmtNum(p.exposed_comm_s * 1e3, 3) + ' ms'],
      ['compute idle', (100 * p.bubble_fraction).toFixed(1) + '%'],
    ]).className = 'summary';
    chart('prediction', canvas(row, 'prediction', 'half'), {
      type: 'bar',
      data: { labels: ['step', 'compute (busiest)', 'communication (busiest)', 'exposed communication', 'overlap penalty'],
        datasets: [{ label: 'ms', data: [p.step_time_s, p.compute_s, p.comm_s, p.exposed_comm_s, p.overlap_penalty_s].map((v) => v * 1e3), backgroundColor: ['#4e79a7', '#76b7b2', '#f28e2b', '#e15759', '#bab0ac'] }] },
      options: { indexAxis: 'y', plugins: { legend: { display: false } }, scales: { x: { title: { display: true, text: 'ms' } } } },
    });
  }

  try {
    const d = JSON.parse(document.getElementById('meshsim-data').textContent);
    el(document.getElementById('report'), 'h1', {}, d.title);
    [summarySection, trainingSection, memorySection, routingSection, collectivesSection, predictionSection].forEach((f) => {
      try { f(d); } catch (e) { showError(f.name + ': ' + e.message); }
    });
    body.dataset.chartsRendered = String(drawn);
  } catch (e) {
    showError('report: ' + e.message);
  }
})();
