/* Live pages (docs/console.md, "Live pages"; console/live.py).

A page whose view finds something in flight (a run queued, running or
waiting, a call waiting for approval) carries this script. Every few
seconds it asks the server for the same page again — the same view, so the
same permission checks and the same queries, never one more per row — and
swaps the regions marked data-live-region that changed (and the window's
title, when the page's changed: a run's names its status). A page that comes
back with nothing in flight carries no script: the polling stops there.

What the operator holds is kept: what they look at stays where it is on
the screen (the first region at the top of the window is held in place,
whatever grew or shrank above it), open <details>, the
checked boxes of a list (their cells are never swapped), and any region the
operator is typing in, has changed a field of, has focus in or selects text
in is left alone until they are done. A tab in the background does not
poll. When the server does not answer, the page stays as it is, says
"not updating" in its corner and tries again, waiting twice as long each
time (up to a minute); a page the server no longer gives (logged out, 403,
404, a redirect) stops and says to reload.

data-live-region on an element with an id:
  ""          the element is swapped whole when it changed;
  "children"  each child element is swapped on its own (matched by id, or
              by tag, class and place), children gone are removed and new
              ones inserted;
  "rows"      a table's body rows, matched by their checkbox's value or
              their first link: each row's cells are swapped, the checkbox
              cell never; rows that came or went are not added or removed
              (that would move what the operator is looking at and selecting):
              the corner says the list changed, with a link to reload.
*/
"use strict";
{
    const marker = document.getElementById("live-poll");
    const HEADER = "X-Nrllm-Live";
    const LONGEST_WAIT_MS = 60000;
    const ANSWER_WITHIN_MS = 10000;
    // A form's token differs on every render: it is not a change.
    const CSRF_VALUE = /(name="csrfmiddlewaretoken" value=")[^"]*"/g;
    // What each unit looked like when it came from the server (the page, or
    // the last poll): a unit that comes back the same is not swapped.
    const received = new WeakMap();

    const interval = Math.max(Number(marker && marker.dataset.intervalMs) || 5000, 100);
    let wait = interval;
    let timer = 0;
    let fetching = false;
    let stopped = !marker || !window.fetch || !window.DOMParser;

    function normalized(html) {
        return html.replace(CSRF_VALUE, '$1"');
    }

    function regions(root) {
        return Array.from(root.querySelectorAll("[data-live-region][id]"));
    }

    function unitsOf(region) {
        const kind = region.dataset.liveRegion;
        if (kind === "children") return Array.from(region.children);
        if (kind === "rows") return rowsOf(region).flatMap((row) => swappableCells(row));
        return [region];
    }

    function remember(element) {
        received.set(element, normalized(element.outerHTML));
    }

    // --- what the operator holds --------------------------------------------------

    function changedSelect(select) {
        if (select.multiple) {
            return Array.from(select.options).some((o) => o.selected !== o.defaultSelected);
        }
        let initial = 0;
        Array.from(select.options).forEach((option, index) => {
            if (option.defaultSelected) initial = index;
        });
        return select.options.length > 0 && select.selectedIndex !== initial;
    }

    function changedField(field) {
        if (field.type === "hidden" || field.type === "submit" || field.type === "button") {
            return false;
        }
        if (field.type === "checkbox" || field.type === "radio") {
            return field.checked !== field.defaultChecked;
        }
        if (field.tagName === "SELECT") return changedSelect(field);
        return field.value !== field.defaultValue;
    }

    /** Whether the operator is at work in ``element``: focus in a control,
     * a field changed from what the page gave, or text selected. */
    function busy(element) {
        const active = document.activeElement;
        if (
            active &&
            element.contains(active) &&
            active.matches("input, textarea, select, button, [contenteditable]")
        ) {
            return true;
        }
        if (Array.from(element.querySelectorAll("input, textarea, select")).some(changedField)) {
            return true;
        }
        const selection = document.getSelection();
        return Boolean(
            selection &&
                !selection.isCollapsed &&
                (element.contains(selection.anchorNode) || element.contains(selection.focusNode)),
        );
    }

    /** Open <details> stay open (and closed ones closed): by id, else by place. */
    function keepDetails(from, to) {
        const before = Array.from(from.querySelectorAll("details"));
        const byId = new Map(before.filter((d) => d.id).map((d) => [d.id, d.open]));
        Array.from(to.querySelectorAll("details")).forEach((details, index) => {
            if (details.id && byId.has(details.id)) details.open = byId.get(details.id);
            else if (!details.id && before[index] && !before[index].id) {
                details.open = before[index].open;
            }
        });
        if (from.tagName === "DETAILS" && to.tagName === "DETAILS") to.open = from.open;
    }

    // --- swapping ---------------------------------------------------------------

    /** ``current`` replaced by ``incoming`` if it changed and nobody is at work
     * in it; returns the element now in the page. */
    function swapUnit(current, incoming, outcome) {
        const html = normalized(incoming.outerHTML);
        if (received.get(current) === html) return current;
        if (busy(current)) {
            outcome.deferred = true;
            return current;
        }
        const fresh = document.importNode(incoming, true);
        keepDetails(current, fresh);
        current.replaceWith(fresh);
        received.set(fresh, html);
        outcome.replaced.set(current, fresh);
        return fresh;
    }

    function keyed(elements) {
        const seen = new Map();
        return elements.map((element) => {
            if (element.id) return ["#" + element.id, element];
            const kind = element.tagName + "." + element.className;
            const place = seen.get(kind) || 0;
            seen.set(kind, place + 1);
            return [kind + "@" + place, element];
        });
    }

    function swapChildren(region, incoming, outcome) {
        const current = new Map(keyed(Array.from(region.children)));
        const placed = keyed(Array.from(incoming.children)).map(([key, element]) => {
            const here = current.get(key);
            current.delete(key);
            if (here) return swapUnit(here, element, outcome);
            const fresh = document.importNode(element, true);
            remember(fresh);
            return fresh;
        });
        current.forEach((gone) => {
            if (busy(gone)) outcome.deferred = true;
            else gone.remove();
        });
        let cursor = region.firstElementChild;
        placed.forEach((element) => {
            if (element === cursor) cursor = cursor.nextElementSibling;
            else region.insertBefore(element, cursor);
        });
    }

    function rowKey(row) {
        const box = row.querySelector("input.action-select");
        if (box) return box.value;
        const link = row.querySelector("a[href]");
        return link ? link.getAttribute("href") : "";
    }

    function rowsOf(region) {
        return Array.from(region.querySelectorAll("tbody tr"));
    }

    function swappableCells(row) {
        return Array.from(row.cells).filter((cell) => !cell.querySelector("input.action-select"));
    }

    function swapRows(region, incoming, outcome) {
        const current = new Map(rowsOf(region).map((row) => [rowKey(row), row]));
        const arrived = rowsOf(incoming);
        let changed = arrived.length !== current.size;
        arrived.forEach((row) => {
            const here = current.get(rowKey(row));
            if (!here || here.cells.length !== row.cells.length) {
                changed = true;
                return;
            }
            Array.from(row.cells).forEach((cell, index) => {
                const old = here.cells[index];
                if (!old.querySelector("input.action-select")) swapUnit(old, cell, outcome);
            });
        });
        if (changed) outcome.listChanged = true;
    }

    /** The first unit at or below the top of the window, and where it is:
     * what the operator is looking at stays there on the screen, whatever
     * grows or shrinks above it. */
    function anchor() {
        for (const region of regions(document)) {
            for (const unit of unitsOf(region)) {
                const box = unit.getBoundingClientRect();
                if (box.bottom > 0 && box.height > 0) return { unit: unit, top: box.top };
            }
        }
        return null;
    }

    function apply(doc) {
        const outcome = { replaced: new Map(), deferred: false, listChanged: false };
        const x = window.scrollX;
        const y = window.scrollY;
        const held = anchor();
        regions(document).forEach((region) => {
            const incoming = doc.getElementById(region.id);
            if (!incoming) return;
            const kind = region.dataset.liveRegion;
            if (kind === "children") swapChildren(region, incoming, outcome);
            else if (kind === "rows") swapRows(region, incoming, outcome);
            else swapUnit(region, incoming, outcome);
        });
        // The window's title names what the page shows (a run with its
        // status): it changes with it.
        if (doc.title && doc.title !== document.title) document.title = doc.title;
        const there = held && (outcome.replaced.get(held.unit) || held.unit);
        if (there && there.isConnected) {
            const moved = there.getBoundingClientRect().top - held.top;
            if (Math.abs(moved) >= 0.5) window.scrollBy(0, moved);
        } else if (window.scrollX !== x || window.scrollY !== y) {
            window.scrollTo(x, y);
        }
        return outcome;
    }

    // --- the quiet mark in the corner -----------------------------------------------

    function say(text, reload) {
        let mark = document.getElementById("live-status");
        if (!text) {
            if (mark) mark.hidden = true;
            return;
        }
        if (!mark) {
            mark = document.createElement("div");
            mark.id = "live-status";
            mark.setAttribute("role", "status");
            document.body.appendChild(mark);
        }
        mark.textContent = text + " ";
        if (reload) {
            const link = document.createElement("a");
            link.href = window.location.href;
            link.textContent = "reload";
            mark.appendChild(link);
        }
        mark.hidden = false;
    }

    // --- polling --------------------------------------------------------------------

    function schedule(delay) {
        clearTimeout(timer);
        timer = 0;
        if (!stopped && !fetching && !document.hidden) timer = setTimeout(poll, delay);
    }

    function notAnswered(why) {
        wait = Math.min(wait * 2, LONGEST_WAIT_MS);
        say(`Not updating: ${why}; trying again in ${Math.round(wait / 1000)} s.`, false);
    }

    async function poll() {
        timer = 0;
        fetching = true;
        const abort = new AbortController();
        const late = setTimeout(() => abort.abort(), ANSWER_WITHIN_MS);
        try {
            const response = await fetch(window.location.href, {
                headers: { [HEADER]: "1" },
                credentials: "same-origin",
                cache: "no-store",
                signal: abort.signal,
            });
            if (response.redirected || [401, 403, 404, 410].includes(response.status)) {
                // Logged out, no longer allowed, or gone: not this page any more.
                stopped = true;
                say("Not updating: this page is no longer what the server gives;", true);
                return;
            }
            if (!response.ok) {
                notAnswered(`the server answered ${response.status}`);
                return;
            }
            const doc = new DOMParser().parseFromString(await response.text(), "text/html");
            const outcome = apply(doc);
            wait = interval;
            say(outcome.listChanged ? "This list has changed since it was shown:" : "", true);
            if (!doc.getElementById("live-poll") && !outcome.deferred) stopped = true;
        } catch (error) {
            notAnswered("the server does not answer");
        } finally {
            clearTimeout(late);
            fetching = false;
            schedule(wait);
        }
    }

    if (!stopped) {
        regions(document).forEach((region) => unitsOf(region).forEach(remember));
        document.addEventListener("visibilitychange", () => {
            if (document.hidden) {
                clearTimeout(timer);
                timer = 0;
            } else {
                schedule(0); // back in front: catch up at once
            }
        });
        schedule(interval);
    }
}
