// Phones (docs/web.md "On a phone"): the page's height follows the part of the screen the
// on-screen keyboard leaves visible, so the composer stays above the keyboard.
//
// Browsers differ: with the viewport's interactive-widget=resizes-content (index.html)
// Chrome on Android shrinks the layout itself and 100% is already right; Safari on iOS and
// browsers without it shrink only the visual viewport, and the keyboard would cover the
// bottom of a 100%-high page. The visual viewport's height, times its scale (a pinch zoom
// shrinks it too, and must not shrink the page), is what is really visible: the page is
// made that high (--app-height in style.css) whenever it is less than the window's.

export function followVisualViewport(prompt) {
  const vv = window.visualViewport;
  if (!vv) return;
  const root = document.documentElement;
  const fit = () => {
    const visible = Math.round(vv.height * vv.scale);
    if (visible < window.innerHeight - 1) root.style.setProperty("--app-height", `${visible}px`);
    else root.style.removeProperty("--app-height");
    // The keyboard came up for the message box: keep the box itself in sight.
    if (document.activeElement === prompt) prompt.scrollIntoView({ block: "nearest" });
  };
  vv.addEventListener("resize", fit);
  fit();
}
