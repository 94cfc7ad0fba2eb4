// The service page's live part: follows GET <page>/live (server-sent events) and writes
// what it says into #live with textContent only (never as HTML). Without this script the
// page shows the same state as rendered and reloads itself while a change is spreading.
(function () {
  "use strict";
  var root = document.getElementById("live");
  if (!root || !window.EventSource) { return; }
  function list(id, items) {
    var ul = document.getElementById(id);
    if (!ul) { return; }
    while (ul.firstChild) { ul.removeChild(ul.firstChild); }
    items.forEach(function (text) {
      var li = document.createElement("li");
      li.textContent = text;
      ul.appendChild(li);
    });
    ul.hidden = items.length === 0;
  }
  function text(id, value) {
    var el = document.getElementById(id);
    if (el) { el.textContent = value; }
  }
  var source = new EventSource(root.getAttribute("data-src"));
  source.addEventListener("state", function (e) {
    var s = JSON.parse(e.data);
    root.setAttribute("data-state", "open");
    root.setAttribute("data-revision", String(s.revision));
    root.setAttribute("data-applied", String(s.applied));
    root.setAttribute("data-connected", String(s.connected));
    text("live-summary", s.summary);
    text("current-status", s.summary);
    var change = document.getElementById("change-status");
    if (change && Number(change.getAttribute("data-revision")) <= s.revision) {
      change.textContent = "Saved as revision " + change.getAttribute("data-revision") + ". " + s.summary;
      change.className = s.connected === 0 ? "warn" : (s.applied === s.connected ? "ok" : "muted");
    }
    text("live-latency", s.latency);
    list("live-nacks", s.nacks);
    list("live-breakers", s.open_breakers);
    list("live-fallbacks", s.fallbacks);
    list("live-agents", s.agents);
    list("live-alarms", s.alarms);
  });
  source.onerror = function () { root.setAttribute("data-state", "closed"); };
}());
