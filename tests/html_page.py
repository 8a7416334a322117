"""A page as a browser without JavaScript shows it, for the tests of swarmd/web/."""

from html.parser import HTMLParser


class Page(HTMLParser):
    """What a browser without JavaScript shows: each table's rows as cell texts, the run's items, the scripts."""

    def __init__(self, html: str):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.items: dict[str, str] = {}
        self.scripts: list[dict] = []
        self.text: list[str] = []
        self.html_class = ""
        self._table = self._row = self._cell = None
        self._in_tbody = self._in_dt = self._in_dd = False
        self._dt = ""
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "html":
            self.html_class = attrs.get("class") or ""
        elif tag == "script":
            self.scripts.append(attrs)
        elif tag == "table":
            self._table = attrs.get("class", "")
            self.tables[self._table] = []
        elif tag == "tbody":
            self._in_tbody = True
        elif tag == "tr" and self._in_tbody:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []
        elif tag == "dt":
            self._in_dt, self._dt = True, ""
        elif tag == "dd":
            self._in_dd = True
            self.items[self._dt] = ""

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "tbody":
            self._in_tbody = False
        elif tag == "dt":
            self._in_dt = False
        elif tag == "dd":
            self._in_dd = False

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._in_dt:
            self._dt += data
        if self._in_dd:
            self.items[self._dt] += data
