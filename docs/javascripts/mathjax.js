// MathJax for the tutorials' formulas ($...$ and $$...$$, marked up by pymdownx.arithmatex).
// MathJax itself is served with the site (docs/_hooks/pages.py copies it): no network needed.
window.MathJax = {
  tex: { inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true },
  // the formulas arithmatex marked, and the titles in the navigation and the table of contents
  // (the text of each is a span.md-ellipsis), where a heading's formula is plain TeX: the toc
  // extension keeps the TeX but not the arithmatex span
  options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex|md-ellipsis" },
};
document$.subscribe(() => {
  MathJax.startup.output.clearCache();
  MathJax.typesetClear();
  MathJax.texReset();
  MathJax.typesetPromise();
});
