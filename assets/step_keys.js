/* SpecFuse Studio, step mode's keys (loaded by app.serve through launch(js=...); no network).
   → or PageDown (a presenter's clicker): Reveal when it is due, else Next; ← or PageUp: Back;
   space: Play / Pause. They work wherever the focus is, the page itself included, except in a
   field that takes typing or arrows (a text box, a slider, a list): there the key is the field's.
   Only while the step bar is shown (step mode on); a disabled button is not pressed. */
(() => {
  if (window.specfuseStepKeys) return;
  window.specfuseStepKeys = true;
  const KEYS = {
    ArrowRight: ["step-reveal", "step-next"],
    PageDown: ["step-reveal", "step-next"],
    ArrowLeft: ["step-back"],
    PageUp: ["step-back"],
    " ": ["step-play"],
  };
  const TYPED = new Set([
    "text", "search", "email", "url", "tel", "password", "number", "range",
    "date", "time", "datetime-local", "month", "week", "color", "file",
  ]);

  function typing(el) {
    if (!el || el === document.body) return false;
    if (el.isContentEditable) return true;
    if (el.tagName === "TEXTAREA" || el.tagName === "SELECT") return true;
    if (el.tagName === "INPUT") return TYPED.has((el.getAttribute("type") || "text").toLowerCase());
    const role = el.getAttribute("role");
    return role === "slider" || role === "combobox" || role === "textbox" || role === "listbox";
  }

  function usable(id) {
    const button = document.getElementById(id);
    return button && button.offsetParent !== null && !button.disabled ? button : null;
  }

  let handled = false;
  document.addEventListener(
    "keydown",
    (event) => {
      handled = false;
      const ids = KEYS[event.key];
      if (!ids || event.ctrlKey || event.metaKey || event.altKey || event.shiftKey) return;
      if (typing(document.activeElement)) return;
      if (!document.getElementById("step-next") || document.getElementById("step-next").offsetParent === null) return;
      // The key is step mode's: no radio moves, no focused button clicks itself, the page does not scroll.
      event.preventDefault();
      event.stopPropagation();
      handled = true;
      if (event.repeat) return;
      for (const id of ids) {
        const button = usable(id);
        if (button) {
          button.click();
          return;
        }
      }
    },
    true,
  );
  // A focused button or checkbox acts on space's keyup: not when the key was step mode's.
  document.addEventListener(
    "keyup",
    (event) => {
      if (handled && event.key === " ") {
        event.preventDefault();
        event.stopPropagation();
      }
    },
    true,
  );
})();
