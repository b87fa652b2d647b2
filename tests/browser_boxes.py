"""What the browser tests measure of a page, from the elements' boxes (not
read off screenshots): whether an element is inside the viewport and
clips nothing, whether a table fits its container, where the browser
broke a line, how many rows are above the fold."""

#: For a selector: its box, the viewport's size, and whether it clips its
#: own content (a box narrower than what it holds, with the rest hidden).
MEASURE = """selector => {
  const element = document.querySelector(selector);
  if (!element) return null;
  const box = element.getBoundingClientRect();
  return {
    left: box.left, right: box.right, top: box.top, bottom: box.bottom,
    viewport: document.documentElement.clientWidth,
    clips: element.scrollWidth > element.clientWidth + 1
      && getComputedStyle(element).overflowX !== "visible",
  };
}"""
#: A table's container: what it holds wider than what it shows; and the
#: cells, or what is in them, whose content is wider than they are (a key
#: that does not wrap, spilling out or scrolling inside).
TABLE_FITS = """selector => {
  const table = document.querySelector(selector);
  const container = table.parentElement;
  // A cell, or anything in it that scrolls (the admin's pre does): cut.
  // What is cut with "…" on purpose, whole in its tooltip, is not spilling.
  const cutOnPurpose = cell => getComputedStyle(cell).textOverflow === "ellipsis"
    && cell.closest("[title]");
  const spilling = [...table.querySelectorAll("td, td *")]
    .filter(cell => cell.clientWidth && cell.scrollWidth > cell.clientWidth + 1)
    .filter(cell => !cutOnPurpose(cell))
    .map(cell => cell.tagName + ": " + cell.textContent.trim().slice(0, 40));
  return {
    scroll: container.scrollWidth, client: container.clientWidth,
    right: table.getBoundingClientRect().right,
    viewport: document.documentElement.clientWidth,
    spilling: spilling,
  };
}"""

#: Whether a selector's element ends inside the content's padding (not
#: under it, against the viewport's edge); with "" the boxes, to report.
INSIDE_CONTENT = """selector => {
  const content = document.querySelector("#content");
  const inner = content.getBoundingClientRect().right
    - parseFloat(getComputedStyle(content).paddingRight);
  if (!selector) return {inner: inner};
  return document.querySelector(selector).getBoundingClientRect().right <= inner + 1;
}"""


def assert_shown(page, *selectors, above_the_fold=False):
    """Each selector's element inside the viewport's width (and height, when
    ``above_the_fold``), not clipping what it holds."""
    height = page.viewport_size["height"]
    for selector in selectors:
        box = page.evaluate(MEASURE, selector)
        assert box is not None, f"{selector}: not on {page.url}"
        assert 0 <= box["left"] and box["right"] <= box["viewport"], (selector, box)
        assert not box["clips"], (selector, box)
        if above_the_fold:
            assert box["top"] >= 0 and box["bottom"] <= height, (selector, box)


#: The rows of the runs list whose box ends above the fold, and the tallest.
ROWS_IN_VIEW = """() => {
  const rows = [...document.querySelectorAll("#result_list tbody tr")];
  return {
    above_the_fold: rows.filter(row => row.getBoundingClientRect().bottom <= innerHeight).length,
    tallest: Math.max(...rows.map(row => row.getBoundingClientRect().height)),
    line: parseFloat(getComputedStyle(rows[0].querySelector("td")).lineHeight),
  };
}"""


#: For each row of the runs list: the pairs of its cells whose boxes
#: overlap, the characters a cell shows outside its own box (spilling into
#: a neighbour's), and per column (its ``field-`` name) how many characters
#: it shows and holds: a character hidden behind a "…" (past the edge of
#: the element that cuts it, less the "…" itself; its left edge for a text
#: laid out right to left) is not shown.
ROW_CELLS = """() => [...document.querySelectorAll("#result_list tbody tr")].map(row => {
  const cells = [...row.cells];
  const boxes = cells.map(cell => cell.getBoundingClientRect());
  const name = cell => (cell.className.match(/field-(\\w+)/) || ["", cell.className])[1];
  const overlapping = [];
  boxes.forEach((a, i) => boxes.forEach((b, j) => {
    if (i < j && a.left < b.right - 0.5 && b.left < a.right - 0.5
        && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5) {
      overlapping.push([name(cells[i]), name(cells[j])]);
    }
  }));
  const outside = [], shown = {}, held = {};
  cells.forEach((cell, index) => {
    const box = boxes[index];
    let count = 0, all = 0;
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      // The element that cuts this text, if any: the nearest that hides overflow.
      let cutter = node.parentElement;
      while (cutter !== cell && getComputedStyle(cutter).overflowX === "visible") {
        cutter = cutter.parentElement;
      }
      const hides = getComputedStyle(cutter).overflowX !== "visible";
      const isCut = hides && cutter.scrollWidth > cutter.clientWidth + 1;
      const ellipsis = isCut ? parseFloat(getComputedStyle(cutter).fontSize) : 0;
      // A text laid out right to left is cut at its left, where it ends.
      const rtl = getComputedStyle(cutter).direction === "rtl";
      const cutterBox = cutter.getBoundingClientRect();
      const edge = hides && !rtl ? cutterBox.right - ellipsis : Infinity;
      const start = hides && rtl ? cutterBox.left + ellipsis : -Infinity;
      for (let i = 0; i < node.length; i++) {
        all++;
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const at = range.getBoundingClientRect();
        // Not laid out, or cut.
        if (!at.width || at.right > edge + 0.5 || at.left < start - 0.5) continue;
        count++;
        // A glyph may reach a little above or below its line box, not into
        // the line above or below.
        if (at.left < box.left - 0.5 || at.right > box.right + 0.5
            || at.top < box.top - 3 || at.bottom > box.bottom + 3) {
          outside.push(name(cell) + ": " + node.data[i]);
        }
      }
    }
    shown[name(cell)] = count;
    held[name(cell)] = all;
  });
  return {text: row.textContent.replace(/\\s+/g, " ").trim().slice(0, 60),
          overlapping, outside, shown, held};
})"""


#: For each element ``selector`` matches: its text and the character each
#: of its lines ends with but the last (where the browser broke it).
LINE_ENDS = """selector => [...document.querySelectorAll(selector)].map(element => {
  const ends = [];
  let top = null, before = "";
  const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (let i = 0; i < node.length; i++) {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const at = range.getBoundingClientRect().top;
      if (top !== null && at > top + 2) ends.push(before);
      top = at;
      before = node.data[i];
    }
  }
  return {text: element.textContent, ends: ends};
})"""


#: The words the browser broke across two lines (a letter or a digit ending
#: one, another beginning the next, in one block) in the elements
#: ``selector`` matches, as "befo|re"; identifiers (``.identifier``,
#: ``.wraps``, ``pre``) may break anywhere and are left out.
BROKEN_WORDS = """selector => {
  const blockOf = node => {
    let element = node.parentElement;
    while (element.parentElement && getComputedStyle(element).display === "inline") {
      element = element.parentElement;
    }
    return element;
  };
  const broken = [];
  for (const element of document.querySelectorAll(selector)) {
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    let last = null;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const free = !node.parentElement.closest(".identifier, .wraps, pre");
      const block = blockOf(node);
      for (let i = 0; i < node.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const box = range.getClientRects()[0];
        if (!box) continue;
        const char = node.data[i];
        if (last && free && last.free && last.block === block && box.top > last.top + 2
            && /[A-Za-z0-9]/.test(last.char) && /[A-Za-z0-9]/.test(char)) {
          broken.push(node.data.slice(Math.max(0, i - 12), i) + "|" + node.data.slice(i, i + 12));
        }
        last = {char: char, top: box.top, free: free, block: block};
      }
    }
  }
  return broken;
}"""


def assert_no_word_broken(page, *selectors):
    """No word of prose in the elements ``selectors`` match is broken
    across lines (identifiers may be)."""
    for selector in selectors:
        assert page.locator(selector).count(), f"{selector}: not on {page.url}"
        broken = page.evaluate(BROKEN_WORDS, selector)
        assert not broken, (page.url, selector, broken)


def assert_table_fits(page, selector):
    fit = page.evaluate(TABLE_FITS, selector)
    assert fit["scroll"] <= fit["client"], (page.url, selector, fit)
    assert fit["right"] <= fit["viewport"], (page.url, selector, fit)
    assert not fit["spilling"], (page.url, selector, fit)
    return fit
