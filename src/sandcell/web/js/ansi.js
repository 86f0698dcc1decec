// Terminal output as text: SGR colours become CSS classes on spans (text inserted with
// textContent); every other escape sequence is dropped, other control characters are shown
// as their visible Unicode symbols. Nothing in the output is ever interpreted as markup.

const SEQUENCE =
  /\x1b\[([0-9;:?]*)([\x20-\x2f]*)([\x40-\x7e])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[PX^_][^\x1b]*(?:\x1b\\)?|\x1b[\x20-\x2f]*[\x30-\x7e]?/g;
const CONTROL = /[\x00-\x08\x0b-\x1f\x7f]/g;

export class AnsiState {
  constructor() { this.reset(); }
  reset() { this.bold = false; this.dim = false; this.italic = false; this.underline = false;
    this.fg = null; this.bg = null; }

  apply(params) {
    const codes = params === "" ? [0] : params.split(/[;:]/).map((p) => Number(p) || 0);
    for (let i = 0; i < codes.length; i += 1) {
      const code = codes[i];
      if (code === 0) this.reset();
      else if (code === 1) this.bold = true;
      else if (code === 2) this.dim = true;
      else if (code === 3) this.italic = true;
      else if (code === 4) this.underline = true;
      else if (code === 22) { this.bold = false; this.dim = false; }
      else if (code === 23) this.italic = false;
      else if (code === 24) this.underline = false;
      else if (code >= 30 && code <= 37) this.fg = code - 30;
      else if (code >= 90 && code <= 97) this.fg = code - 90 + 8;
      else if (code === 39) this.fg = null;
      else if (code >= 40 && code <= 47) this.bg = code - 40;
      else if (code >= 100 && code <= 107) this.bg = code - 100 + 8;
      else if (code === 49) this.bg = null;
      else if (code === 38 || code === 48) i += codes[i + 1] === 5 ? 2 : 4; // 256/true colour
    }
  }

  classes() {
    const names = [];
    if (this.bold) names.push("ansi-bold");
    if (this.dim) names.push("ansi-dim");
    if (this.italic) names.push("ansi-italic");
    if (this.underline) names.push("ansi-underline");
    if (this.fg !== null) names.push(`ansi-fg-${this.fg}`);
    if (this.bg !== null) names.push(`ansi-bg-${this.bg}`);
    return names.join(" ");
  }
}

function visible(text) {
  return text.replace(CONTROL, (c) =>
    c === "\r" ? "" : String.fromCharCode(c === "\x7f" ? 0x2421 : 0x2400 + c.charCodeAt(0)));
}

// Append `text` to `parent` as spans; `state` carries colours across chunks.
export function renderAnsi(parent, text, state = new AnsiState(), extraClass = "") {
  let last = 0;
  const emit = (piece) => {
    if (!piece) return;
    const span = document.createElement("span");
    const cls = [state.classes(), extraClass].filter(Boolean).join(" ");
    if (cls) span.className = cls;
    span.textContent = visible(piece);
    parent.append(span);
  };
  for (const match of text.matchAll(SEQUENCE)) {
    emit(text.slice(last, match.index));
    if (match[3] === "m" && match[2] === "") state.apply(match[1]);
    last = match.index + match[0].length;
  }
  emit(text.slice(last));
  return state;
}
