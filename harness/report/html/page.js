// report.html's behaviour: sortable tables, synchronized video players (with the drift plots'
// cursors), A/B audio players. No network, no state kept: the page is the same bytes every time.
(function () {
  "use strict";

  // --- sortable tables: click a header; numbers sort by data-sort, cells without one sort last ---
  function sortTable(th) {
    var table = th.closest("table"), body = table.tBodies[0];
    var col = Array.prototype.indexOf.call(th.parentNode.children, th);
    var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    table.querySelectorAll("thead th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
    var rows = Array.prototype.slice.call(body.rows);
    var key = function (tr) {
      var td = tr.cells[col];
      var s = td ? td.getAttribute("data-sort") : null;
      return s === null ? { num: null, text: td ? td.textContent : "" } : { num: parseFloat(s), text: "" };
    };
    var numeric = rows.some(function (tr) { return key(tr).num !== null; });
    rows.sort(function (a, b) {
      var ka = key(a), kb = key(b);
      if (numeric) {
        if (ka.num === null || kb.num === null) { return (ka.num === null) - (kb.num === null); }
        return ka.num < kb.num ? -dir : ka.num > kb.num ? dir : 0;  // Infinity - Infinity would be NaN
      }
      return dir * ka.text.localeCompare(kb.text, undefined, { numeric: true });
    });
    rows.forEach(function (tr) { body.appendChild(tr); });
  }
  document.querySelectorAll("table.sortable thead th").forEach(function (th) {
    th.addEventListener("click", function () { sortTable(th); });
  });

  // --- synchronized videos: one control bar plays, pauses, steps and seeks every player --------
  function syncGroup(group) {
    var videos = Array.prototype.slice.call(group.querySelectorAll("video"));
    if (!videos.length) { return; }
    var lead = videos[0];
    var section = group.closest("section");
    var frames = parseInt(section.getAttribute("data-frames"), 10) || 0;
    var play = group.querySelector(".sync-play"), seek = group.querySelector(".sync-seek");
    var label = group.querySelector(".sync-time"), loop = group.querySelector(".sync-loop");
    var plot = document.getElementById(group.getAttribute("data-plot"));
    var plotFrames = (group.getAttribute("data-plot-frames") || "").split(",").filter(Boolean).map(Number);
    var fps = function () { return frames && lead.duration ? frames / lead.duration : 16; };
    var frameAt = function (t) { return Math.min(Math.max(frames - 1, 0), Math.floor(t * fps() + 1e-6)); };

    function seekAll(t) {
      videos.forEach(function (v) { v.currentTime = t; });
      show();
    }
    function show() {
      var t = lead.currentTime, d = lead.duration || 0;
      if (d) { seek.value = Math.round(1000 * t / d); }
      label.textContent = "frame " + frameAt(t) + (frames ? " / " + (frames - 1) : "");
      play.textContent = lead.paused ? "▶ play" : "❚❚ pause";
      if (plot && plot.layout && plotFrames.length && d && window.Plotly) {
        var update = {};
        plotFrames.forEach(function (n, i) {
          var x = Math.min(n - 1, Math.floor(n * t / d));
          update["shapes[" + i + "].x0"] = x;
          update["shapes[" + i + "].x1"] = x;
        });
        window.Plotly.relayout(plot, update);
      }
    }
    function toggle() {
      if (lead.paused) {
        if (lead.ended || lead.currentTime >= lead.duration) { seekAll(0); }
        videos.forEach(function (v) { v.play().catch(function () {}); });
      } else {
        videos.forEach(function (v) { v.pause(); });
      }
    }
    play.addEventListener("click", toggle);
    videos.forEach(function (v) { v.addEventListener("click", toggle); });
    group.querySelectorAll(".sync-step").forEach(function (b) {
      b.addEventListener("click", function () {
        videos.forEach(function (v) { v.pause(); });
        var f = Math.min(Math.max(frameAt(lead.currentTime) + parseInt(b.getAttribute("data-step"), 10), 0), Math.max(frames - 1, 0));
        seekAll((f + 0.5) / fps());
      });
    });
    seek.addEventListener("input", function () {
      if (lead.duration) { seekAll(lead.duration * seek.value / 1000); }
    });
    group.querySelector(".sync-rate").addEventListener("change", function (e) {
      videos.forEach(function (v) { v.playbackRate = parseFloat(e.target.value); });
    });
    lead.addEventListener("timeupdate", function () {
      // the followers keep to the lead: a drift of more than half a frame is corrected
      videos.slice(1).forEach(function (v) {
        if (!lead.paused && Math.abs(v.currentTime - lead.currentTime) > 0.5 / fps()) { v.currentTime = lead.currentTime; }
      });
      show();
    });
    lead.addEventListener("ended", function () {
      if (loop.checked) { seekAll(0); videos.forEach(function (v) { v.play().catch(function () {}); }); } else { show(); }
    });
    ["play", "pause", "loadedmetadata", "seeked"].forEach(function (ev) { lead.addEventListener(ev, show); });
    if (plot && plot.on) {
      plot.on("plotly_click", function (data) {
        var p = data.points[0], n = plotFrames[(p.xaxis._id === "x" ? 1 : parseInt(p.xaxis._id.slice(1), 10)) - 1] || frames;
        videos.forEach(function (v) { v.pause(); });
        if (lead.duration) { seekAll(lead.duration * (p.x + 0.5) / n); }
      });
    }
    show();
  }
  document.querySelectorAll(".sync-group").forEach(syncGroup);

  // --- A/B audio: playing one player pauses the others and takes over at their position --------
  document.querySelectorAll(".ab-group").forEach(function (group) {
    var players = Array.prototype.slice.call(group.querySelectorAll("audio"));
    players.forEach(function (a) {
      a.addEventListener("play", function () {
        players.forEach(function (o) {
          if (o !== a && !o.paused) {
            o.pause();
            if (Math.abs(a.currentTime - o.currentTime) > 0.05 && o.currentTime < (a.duration || Infinity)) { a.currentTime = o.currentTime; }
          }
        });
      });
    });
  });
})();
