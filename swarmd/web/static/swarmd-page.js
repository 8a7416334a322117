// swarmd's page script: live updates without reloading. No build step; uPlot (static/uPlot.iife.min.js) draws.
//
// Every few seconds it fetches this same page and swaps in each element marked data-live (the server rendered and
// escaped them: this script never builds HTML from what peers publish), and redraws each chart (figure[data-chart])
// from its JSON source (data-source, e.g. api/status; data-key, a history of [x, value] pairs, or
// {series: [{label, points}]} for several curves; data-x, "epoch" or "time" for Unix seconds).
// Without JavaScript the server-rendered page is complete but for the curves.
(function () {
  "use strict";
  var POLL_MS = 3000, TIMEOUT_MS = 5000, HEIGHT = 200;
  var COLORS = ["#2f6fd6", "#d65f2f", "#2f9e6f", "#9b4fd6", "#c9a227", "#d62f7a", "#4fb3d6", "#6b6b6b"];
  var plots = {};  // chart id -> uPlot
  var lastUpdate = null;

  document.documentElement.classList.add("js");

  function fetchWithin(url, ms) {
    var controller = new AbortController();
    var timer = setTimeout(function () { controller.abort(); }, ms);
    return fetch(url, {cache: "no-store", signal: controller.signal}).then(function (response) {
      clearTimeout(timer);
      if (!response.ok) throw new Error(url + ": HTTP " + response.status);
      return response;
    });
  }

  // The series of one chart from its source: one peer's history -> one series named after the peer; the
  // monitor's {series: [{label, points}]} -> one series each (labels go through uPlot's textContent, never HTML).
  function seriesOf(data, key) {
    var value = data[key] || [];
    if (value.series) {
      return value.series.map(function (s) { return {label: String(s.label), points: s.points || []}; });
    }
    return [{label: String(data.public_name || "this peer"), points: value}];
  }

  function draw(figure, series) {
    var box = figure.querySelector(".plot");
    var filled = series.filter(function (s) { return s.points.length > 0; });
    if (!filled.length) {
      if (plots[figure.id]) { plots[figure.id].destroy(); delete plots[figure.id]; }
      box.textContent = "";
      var note = document.createElement("p");
      note.className = "empty";
      note.textContent = figure.dataset.x === "time" ? "No read of the swarm yet." : "No epoch finished yet.";
      box.appendChild(note);
      return;
    }
    var byTime = figure.dataset.x === "time";
    var tables = filled.map(function (s) {
      return [s.points.map(function (p) { return p[0]; }), s.points.map(function (p) { return p[1]; })];
    });
    var data = uPlot.join(tables);
    var labels = filled.map(function (s) { return s.label; }).join("\u0000");
    var plot = plots[figure.id];
    if (plot && plot._labels === labels) {
      plot.setData(data);
      return;
    }
    if (plot) plot.destroy();
    box.textContent = "";
    plot = new uPlot({
      width: Math.max(240, box.clientWidth), height: HEIGHT,
      scales: {x: {time: byTime}},
      axes: [{label: byTime ? "time" : "epoch"}, {label: figure.dataset.unit, size: 60}],
      series: [{label: byTime ? "time" : "epoch"}].concat(filled.map(function (s, i) {
        return {label: s.label, stroke: COLORS[i % COLORS.length], width: 2, points: {show: s.points.length < 40}};
      })),
    }, data, box);
    plot._labels = labels;
    plots[figure.id] = plot;
  }

  function swapLive(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    document.querySelectorAll("[data-live]").forEach(function (old) {
      var replacement = old.id && fresh.getElementById(old.id);
      if (replacement) old.replaceWith(document.importNode(replacement, true));
    });
  }

  function drawCharts() {
    var figures = Array.prototype.slice.call(document.querySelectorAll("figure[data-chart]"));
    var sources = {};
    figures.forEach(function (f) { sources[f.dataset.source] = true; });
    return Promise.all(Object.keys(sources).map(function (url) {
      return fetchWithin(url, TIMEOUT_MS).then(function (r) { return r.json(); }).then(function (data) {
        figures.forEach(function (f) { if (f.dataset.source === url) draw(f, seriesOf(data, f.dataset.key)); });
      });
    }));
  }

  function markStale(error) {
    var live = document.getElementById("live");
    if (!live) return;
    live.classList.add("stale");
    live.textContent = "not updating (" + error.message + ")" +
      (lastUpdate ? "; last update " + lastUpdate.toLocaleTimeString() : "");
  }

  function refresh() {
    var page = fetchWithin(location.pathname + location.search, TIMEOUT_MS)
      .then(function (r) { return r.text(); }).then(swapLive);
    Promise.all([page, drawCharts()])
      .then(function () { lastUpdate = new Date(); })
      .catch(markStale)
      .then(function () { setTimeout(refresh, POLL_MS); });
  }

  window.addEventListener("resize", function () {
    Object.keys(plots).forEach(function (id) {
      var box = document.getElementById(id).querySelector(".plot");
      plots[id].setSize({width: Math.max(240, box.clientWidth), height: HEIGHT});
    });
  });

  drawCharts().catch(markStale).then(function () { setTimeout(refresh, POLL_MS); });
})();
