// The fleet dashboard's live parts: the "Now" figures are polled every second from
// now.json; when the turn count moves (at most every 5 s) or once a minute the figures below
// are re-rendered by the server and swapped in (the page's own HTML, fetched again), and the
// charts (Chart.js, vendored) are drawn from the JSON embedded in it.
(function () {
  "use strict";

  var root = document.getElementById("dashboard");
  if (!root) { return; }
  var nowUrl = root.dataset.nowUrl;
  var pollMs = Number(root.dataset.pollMs) || 1000;
  var minRefreshMs = 5000;
  var maxRefreshMs = 60000;
  var paused = document.getElementById("dash-paused");
  var lastTurns = null;
  var lastRefresh = Date.now();
  var refreshing = false;
  var refreshTimer = null;
  var charts = [];

  function pct(value) { return (value * 100).toFixed(1) + " %"; }

  function lookup(data, path) {
    return path.split(".").reduce(function (obj, key) { return obj == null ? undefined : obj[key]; }, data);
  }

  function applyNow(data) {
    root.querySelectorAll("[data-now]").forEach(function (el) {
      var value = lookup(data, el.dataset.now);
      if (value === undefined || value === null) { return; }
      el.textContent = el.dataset.format === "pct" ? pct(value) : String(value);
    });
    root.querySelectorAll("[data-now-unavailable]").forEach(function (el) {
      el.hidden = data.sessions_available;
    });
    if (lastTurns !== null && data.turns_last_hour !== lastTurns) { requestRefresh(); }
    lastTurns = data.turns_last_hour;
  }

  function poll() {
    if (document.hidden) { setTimeout(poll, pollMs); return; }
    fetch(nowUrl, {credentials: "same-origin", cache: "no-store", headers: {Accept: "application/json"}})
      .then(function (response) {
        if (!response.ok || response.redirected) { throw new Error("status " + response.status); }
        return response.json();
      })
      .then(function (data) { paused.hidden = true; applyNow(data); })
      .catch(function () { paused.hidden = false; })
      .finally(function () { setTimeout(poll, pollMs); });
  }

  function requestRefresh() {
    if (refreshTimer !== null) { return; }
    var wait = Math.max(0, lastRefresh + minRefreshMs - Date.now());
    refreshTimer = setTimeout(function () { refreshTimer = null; refreshFigures(); }, wait);
  }

  function refreshFigures() {
    if (refreshing) { return; }
    refreshing = true;
    fetch(window.location.href, {credentials: "same-origin", cache: "no-store"})
      .then(function (response) {
        if (!response.ok || response.redirected) { throw new Error("status " + response.status); }
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("dash-figures");
        var current = document.getElementById("dash-figures");
        if (fresh && current) {
          current.replaceWith(document.adoptNode(fresh));
          drawCharts();
        }
      })
      .catch(function () { /* the next change or the minute timer tries again */ })
      .finally(function () { refreshing = false; lastRefresh = Date.now(); });
  }

  function cssVar(name, fallback) {
    var value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return value || fallback;
  }

  function baseOptions(yTitle) {
    var text = cssVar("--body-quiet-color", "#666");
    var grid = cssVar("--hairline-color", "#e8e8e8");
    return {
      animation: false, responsive: true, maintainAspectRatio: false,
      interaction: {mode: "index", intersect: false},
      scales: {
        x: {ticks: {color: text, maxRotation: 0, autoSkipPadding: 12}, grid: {color: grid}},
        y: {beginAtZero: true, ticks: {color: text}, grid: {color: grid}, title: {display: true, text: yTitle, color: text}}
      },
      plugins: {legend: {position: "bottom", labels: {color: text, boxWidth: 12}}}
    };
  }

  function drawCharts() {
    charts.forEach(function (chart) { chart.destroy(); });
    charts = [];
    var source = document.getElementById("dash-chart-data");
    if (!window.Chart || !source) { return; }
    var data = JSON.parse(source.textContent);
    var labels = data.labels;
    root.querySelectorAll("canvas[data-series]").forEach(function (canvas) {
      var series = data.series.stages[canvas.dataset.series];
      if (!series) { return; }
      charts.push(new window.Chart(canvas, {
        type: "line",
        data: {
          labels: data.series.labels,
          datasets: [
            {label: labels.p50, data: series.p50, borderColor: "#417690", backgroundColor: "#417690", pointRadius: 2, spanGaps: false},
            {label: labels.p95, data: series.p95, borderColor: "#d9822b", backgroundColor: "#d9822b", pointRadius: 2, spanGaps: false}
          ]
        },
        options: baseOptions(labels.ms)
      }));
    });
    var histogram = root.querySelector("canvas[data-histogram]");
    if (histogram && data.histogram.length) {
      charts.push(new window.Chart(histogram, {
        type: "bar",
        data: {
          labels: data.histogram.map(function (bin) { return Math.round(bin.from) + "–" + Math.round(bin.to) + " " + labels.ms; }),
          datasets: [{label: labels.turns, data: data.histogram.map(function (bin) { return bin.count; }),
                      backgroundColor: "#79aec8", barPercentage: 1.0, categoryPercentage: 0.95}]
        },
        options: baseOptions(labels.turns)
      }));
    }
  }

  drawCharts();
  poll();
  setInterval(function () {
    if (!document.hidden && Date.now() - lastRefresh >= maxRefreshMs) { refreshFigures(); }
  }, 10000);
})();
