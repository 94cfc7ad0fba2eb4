// Live pages (overview, environment, service): follows the page's server-sent events
// (#live[data-src]) and, when their fingerprint of the page's state differs from the one
// the page was rendered with, fetches the page again and puts its [data-live] sections
// in place of the old ones. Every status is rendered by the server from one read, so the
// sections never disagree; this script writes no markup of its own (only attributes and
// the `hidden` of the stale-page notice). Without it the page shows the state as rendered
// and reloads itself while a change is spreading.
(function () {
  "use strict";
  // A page restored from the back/forward cache shows the state of when it was left:
  // load it again instead.
  window.addEventListener("pageshow", function (e) {
    if (e.persisted) { window.location.reload(); }
  });
  var root = document.getElementById("live");
  if (!root || !window.EventSource || !window.fetch || !window.DOMParser) { return; }
  var token = root.getAttribute("data-token");
  var pageRevision = root.getAttribute("data-page-revision");
  var busy = false;
  var again = false;

  function swap(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    var fresh = doc.querySelectorAll("[data-live][id]");
    for (var i = 0; i < fresh.length; i++) {
      var old = document.getElementById(fresh[i].id);
      if (old) { old.replaceWith(document.importNode(fresh[i], true)); }
    }
    var next = doc.getElementById("live");
    if (next) { token = next.getAttribute("data-token"); }
  }

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(swap)
      .catch(function () { root.setAttribute("data-state", "closed"); })
      .then(function () {
        busy = false;
        root.setAttribute("data-token", token);
        if (again) { again = false; refresh(); }
      });
  }

  var source = new EventSource(root.getAttribute("data-src"));
  source.addEventListener("state", function (e) {
    var s = JSON.parse(e.data);
    root.setAttribute("data-state", "open");
    root.setAttribute("data-revision", String(s.revision));
    root.setAttribute("data-applied", String(s.applied));
    root.setAttribute("data-connected", String(s.connected));
    var stale = document.getElementById("stale");
    if (stale && pageRevision !== null) { stale.hidden = String(s.revision) === pageRevision; }
    if (s.token !== token) { token = s.token; refresh(); }
  });
  source.onerror = function () { root.setAttribute("data-state", "closed"); };
}());
