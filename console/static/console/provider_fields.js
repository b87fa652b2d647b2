// The agent form's provider (console/agent_provider.py): only the fields the
// chosen kind takes are shown, the others hidden and disabled, so a value
// typed for another kind is not sent. The kinds' fields come from the
// select's data-takes (the providers' own JSON Schemas). Without this
// script every field shows, and a field the kind does not take is refused
// by name when the form is saved.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const kind = document.getElementById("id_provider");
  if (!kind || !kind.dataset.takes) return;
  const takes = JSON.parse(kind.dataset.takes);
  const fields = [...new Set(Object.values(takes).flat())];
  const show = () => {
    const taken = takes[kind.value] || fields;
    for (const name of fields) {
      const row = document.querySelector(".form-row.field-" + name);
      const input = document.getElementById("id_" + name);
      if (!row || !input) continue;
      // A row with an error stays shown: the error must be seen.
      const off = !taken.includes(name) && !row.classList.contains("errors");
      row.hidden = off;
      input.disabled = off;
    }
  };
  kind.addEventListener("change", show);
  show();
});
