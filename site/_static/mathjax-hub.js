// The widgets' HTML manager typesets a label through MathJax 2's
// MathJax.Hub.Queue whenever window.MathJax exists; the site loads MathJax 3,
// which has no Hub (a page with math then threw "reading 'Queue'" once per
// widget). Give whatever window.MathJax is, config or MathJax 3 itself, a Hub
// whose Queue typesets the label with MathJax 3, once MathJax has loaded.
(function () {
  function withHub(mathjax) {
    if (mathjax && typeof mathjax === "object" && !mathjax.Hub) {
      mathjax.Hub = {
        Queue: function (job) {
          var element = job && job[2];
          var current = window.MathJax;
          if (element && current && current.typesetPromise) {
            current.typesetPromise([element]).catch(function () {});
          }
        }
      };
    }
    return mathjax;
  }
  var current = withHub(window.MathJax);
  Object.defineProperty(window, "MathJax", {
    configurable: true,
    get: function () { return current; },
    set: function (value) { current = withHub(value); }
  });
})();
