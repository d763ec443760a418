// Attachments of the next prompt: images and documents picked, pasted or dropped, read in
// the page as base64 and shown as chips; checked against what the API takes before
// anything is sent (docs/api.md §4.6).

import { $, el, sizeText } from "./dom.js";

// What the API takes as content blocks (bridge/api/content.py): these media types, at most
// 64 blocks, and one request body (or WebSocket frame) of at most 8 MiB.
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
const DOCUMENT_TYPES = ["application/pdf", "text/plain"];
const MAX_BLOCKS = 64;
export const MAX_BODY_BYTES = 8 * 1024 * 1024;
export const BODY_SLACK = 16 * 1024; // JSON punctuation, the client_id, the block wrappers

// The media type the API knows a file by, or null. Browsers give text files without a
// known extension no type; a .txt file is text/plain whatever the browser says.
function mediaType(file) {
  const t = (file.type || "").toLowerCase();
  if (IMAGE_TYPES.includes(t) || DOCUMENT_TYPES.includes(t)) return t;
  if (/\.txt$/i.test(file.name || "") && (!t || t.startsWith("text/"))) return "text/plain";
  return null;
}

function readBase64(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => {
      const url = String(r.result);
      resolve(url.slice(url.indexOf(",") + 1)); // data:<type>;base64,<data>
    };
    r.onerror = () => reject(r.error || new Error("cannot read the file"));
    r.readAsDataURL(file);
  });
}

export class Attachments {
  constructor() {
    this.items = []; // {id, name, size, block, mediaType, data}: sent with the next prompt
    this.seq = 0;
  }

  /** The items, now emptied (they go with a prompt). */
  take() {
    const items = this.items;
    this.items = [];
    this.render();
    return items;
  }

  /** Items back in the composer (the prompt was not sent), unless others were added. */
  restore(items) {
    if (this.items.length) return;
    this.items = items;
    this.render();
  }

  // Bytes the attachments add to the request body (base64 is 4/3 of the file).
  bytes(list = this.items) {
    return list.reduce((n, a) => n + a.data.length, 0);
  }

  async add(files) {
    const problems = [];
    for (const file of files) {
      const type = mediaType(file);
      const name = file.name || "pasted file";
      if (!type) {
        problems.push(`${name}: this type of file cannot be sent (images: PNG, JPEG, GIF, WebP; documents: PDF, plain text)`);
        continue;
      }
      if (this.items.length + 1 >= MAX_BLOCKS) {
        problems.push(`${name}: at most ${MAX_BLOCKS - 1} attachments in one message`);
        continue;
      }
      const encoded = 4 * Math.ceil(file.size / 3);
      const text = $("#prompt").value;
      if (this.bytes() + encoded + text.length * 3 + BODY_SLACK > MAX_BODY_BYTES) {
        problems.push(`${name} (${sizeText(file.size)}): too large — one message can carry about ${sizeText(Math.floor(((MAX_BODY_BYTES - BODY_SLACK) * 3) / 4))} of attachments`);
        continue;
      }
      let data;
      try {
        data = await readBase64(file);
      } catch (err) {
        problems.push(`${name}: ${err.message}`);
        continue;
      }
      this.items.push({
        id: `att-${++this.seq}`,
        name,
        size: file.size,
        mediaType: type,
        block: IMAGE_TYPES.includes(type) ? "image" : "document",
        data,
      });
    }
    $("#send-error").textContent = problems.length ? `Not attached: ${problems.join("; ")}` : "";
    this.render();
  }

  remove(id) {
    const i = this.items.findIndex((a) => a.id === id);
    if (i < 0) return;
    this.items.splice(i, 1);
    this.render();
    // Keep the keyboard where it was: on the next chip's remove button, else the box.
    const buttons = document.querySelectorAll("#attachments .att-remove");
    (buttons[Math.min(i, buttons.length - 1)] || $("#prompt")).focus();
  }

  render() {
    const list = $("#attachments");
    list.replaceChildren();
    list.hidden = !this.items.length;
    for (const a of this.items) {
      const li = el("li", "att-chip");
      li.dataset.mediaType = a.mediaType;
      if (a.block === "image") {
        const img = el("img", "att-thumb");
        img.alt = "";
        img.src = `data:${a.mediaType};base64,${a.data}`;
        li.append(img);
      }
      li.append(el("span", "att-name", a.name), el("span", "att-size", sizeText(a.size)));
      const rm = el("button", "att-remove small", "×");
      rm.type = "button";
      rm.setAttribute("aria-label", `Remove ${a.name}`);
      rm.addEventListener("click", () => this.remove(a.id));
      li.append(rm);
      list.append(li);
    }
    $("#attach").textContent = this.items.length ? `Attach (${this.items.length})` : "Attach";
  }
}
