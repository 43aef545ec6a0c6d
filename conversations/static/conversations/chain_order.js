/* Up/down ordering for a persona's provider chains (admin inlines over PersonaProvider).
 * Rows are moved in the DOM; every position box of the group is then renumbered in row
 * order, so what is saved is what is seen. Without JavaScript the position boxes stay
 * editable numbers. No dependencies. */
(function () {
  "use strict";

  function rows(tbody) {
    return Array.prototype.filter.call(tbody.querySelectorAll("tr.form-row"), function (row) {
      return !row.classList.contains("empty-form") && row.querySelector("input.chain-position");
    });
  }

  function renumber(tbody) {
    rows(tbody).forEach(function (row, index) {
      row.querySelector("input.chain-position").value = String(index);
    });
  }

  function move(row, step) {
    var tbody = row.parentNode;
    var list = rows(tbody);
    var at = list.indexOf(row);
    var other = list[at + step];
    if (!other) { return; }
    if (step < 0) { tbody.insertBefore(row, other); } else { tbody.insertBefore(other, row); }
    renumber(tbody);
    row.querySelector(step < 0 ? "button.chain-up" : "button.chain-down").focus();
  }

  function button(label, cls, title) {
    var b = document.createElement("button");
    b.type = "button";
    b.className = "chain-move " + cls;
    b.textContent = label;
    b.title = title;
    b.setAttribute("aria-label", title);
    return b;
  }

  function decorate(row) {
    var input = row.querySelector("input.chain-position");
    if (!input || row.querySelector("button.chain-up")) { return; }
    input.readOnly = true;
    input.tabIndex = -1;
    var cell = input.parentNode;
    var up = button("\u2191", "chain-up", cell.closest("[data-chain-up]").getAttribute("data-chain-up"));
    var down = button("\u2193", "chain-down", cell.closest("[data-chain-up]").getAttribute("data-chain-down"));
    up.addEventListener("click", function () { move(row, -1); });
    down.addEventListener("click", function () { move(row, 1); });
    cell.appendChild(up);
    cell.appendChild(down);
  }

  function setUp(group) {
    var tbody = group.querySelector("tbody");
    if (!tbody) { return; }
    rows(tbody).forEach(decorate);
    renumber(tbody);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var groups = [];
    document.querySelectorAll("input.chain-position").forEach(function (input) {
      var group = input.closest(".inline-group");
      if (group && groups.indexOf(group) < 0) { groups.push(group); }
    });
    groups.forEach(function (group) {
      var labels = document.getElementById("chain-order-labels");
      group.setAttribute("data-chain-up", labels ? labels.dataset.up : "Move up");
      group.setAttribute("data-chain-down", labels ? labels.dataset.down : "Move down");
      setUp(group);
    });
    document.addEventListener("formset:added", function (event) {
      var row = event.target;
      var group = row.closest(".inline-group");
      if (group && groups.indexOf(group) >= 0) {
        decorate(row);
        renumber(row.parentNode);
      }
    });
    document.addEventListener("formset:removed", function () {
      groups.forEach(function (group) { renumber(group.querySelector("tbody")); });
    });
    document.querySelectorAll("form").forEach(function (form) {
      form.addEventListener("submit", function () {
        groups.forEach(function (group) { renumber(group.querySelector("tbody")); });
      });
    });
  });
})();
