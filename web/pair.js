// "Sign in another device" (docs/web.md "Pairing a phone"; docs/api.md §3.7): a fresh
// one-time sign-in link each time the dialog opens, shown as a QR code for a phone's
// camera. The daemon draws the code (an SVG data: URI, which the page's img-src allows);
// the page only shows it, counts down its life, and forgets it when the dialog closes, so
// a secret never lingers on screen or in the DOM.
import { $ } from "./dom.js";
import { api } from "./net.js";

const LOOPBACK = /^(localhost|.*\.localhost|127(\.\d+){3}|\[::1\])$/i;

function clock(seconds) {
  const s = Math.max(0, Math.ceil(seconds));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}

export class PairDialog {
  constructor() {
    this.dialog = $("#pair-dialog");
    this.img = $("#pair-qr");
    this.link = $("#pair-link");
    this.status = $("#pair-status");
    this.timer = 0;
    this.asked = 0; // which request's answer may still fill the dialog
  }

  bind() {
    $("#pair").addEventListener("click", () => this.open());
    $("#pair-new").addEventListener("click", () => this.fresh());
    $("#pair-close").addEventListener("click", () => this.dialog.close());
    this.dialog.addEventListener("close", () => this.forget());
    return this;
  }

  async open() {
    this.forget();
    // A phone cannot reach a loopback address: say so before it is tried.
    $("#pair-loopback").hidden = !LOOPBACK.test(location.hostname);
    this.dialog.showModal();
    $("#pair-close").focus();
    await this.fresh();
  }

  async fresh() {
    const asked = ++this.asked;
    this.forget(false);
    this.status.textContent = "Making a one-time code…";
    let answer;
    try {
      answer = await api("POST", "/v1/me/pairing");
    } catch (err) {
      if (asked === this.asked) this.status.textContent = `Could not make a code: ${err.message}`;
      return;
    }
    // Closed, or asked again, while this one was on its way: it is not shown.
    if (asked !== this.asked || !this.dialog.open) return;
    this.img.src = answer.qr_svg;
    this.img.hidden = false;
    this.link.textContent = answer.link;
    if (answer.expires_in_s == null) {
      this.status.textContent = "This daemon needs no sign-in: the code opens the page.";
      return;
    }
    const end = Date.now() + answer.expires_in_s * 1000;
    const tick = () => {
      const left = (end - Date.now()) / 1000;
      if (left > 0) {
        this.status.textContent = `Scan it with the other device's camera. Works once; expires in ${clock(left)}.`;
        return;
      }
      this.forget(false);
      this.status.textContent = "That code has expired. Press “New code” for another.";
    };
    tick();
    this.timer = setInterval(tick, 1000);
  }

  /** Clears the code from the dialog (and, with `all`, any answer still on its way). */
  forget(all = true) {
    if (all) this.asked += 1;
    clearInterval(this.timer);
    this.timer = 0;
    this.img.hidden = true;
    this.img.removeAttribute("src");
    this.link.textContent = "";
    this.status.textContent = "";
  }
}
