#include "trainer/charts/svg_chart.h"

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace integration::charts {
namespace {

using ::testing::HasSubstr;

// Coordinates are printed with two decimals, so a position read back from the SVG is
// within 0.005 px of the computed one; 0.011 px covers that rounding on two values plus
// double arithmetic, far inside the "within a pixel" the charts promise.
constexpr double kPrintTolerance = 0.011;

// ---- A small XML checker --------------------------------------------------------------
// Checks that a document is well-formed in the sense the charts need: one root element,
// every opened element closed in order, attribute values quoted, no raw '<' or '&'
// outside markup and entity references, and builds a tree to query.

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;  // values with entities decoded
  std::vector<std::unique_ptr<Element>> children;
  std::string text;  // this element's own character data, entities decoded

  std::string Attr(const std::string& key) const {
    auto it = attrs.find(key);
    return it == attrs.end() ? "" : it->second;
  }
};

bool IsNameStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}
bool IsNameChar(char c) {
  return IsNameStart(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.';
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

absl::StatusOr<std::string> DecodeEntities(absl::string_view raw) {
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '<') return absl::InvalidArgumentError("raw '<' in character data");
    if (raw[i] != '&') {
      out += raw[i];
      continue;
    }
    const size_t semi = raw.find(';', i);
    if (semi == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("unterminated '&' at ", raw.substr(i)));
    }
    const absl::string_view ref = raw.substr(i + 1, semi - i - 1);
    if (ref == "amp")
      out += '&';
    else if (ref == "lt")
      out += '<';
    else if (ref == "gt")
      out += '>';
    else if (ref == "quot")
      out += '"';
    else if (ref == "apos")
      out += '\'';
    else if (ref.size() >= 2 && ref[0] == '#') {
      uint32_t cp = 0;
      const bool hex = ref[1] == 'x';
      const absl::string_view digits = ref.substr(hex ? 2 : 1);
      const bool parsed = hex ? absl::SimpleHexAtoi(digits, &cp) : absl::SimpleAtoi(digits, &cp);
      if (digits.empty() || !parsed) {
        return absl::InvalidArgumentError(absl::StrCat("bad character reference &", ref, ";"));
      }
      AppendUtf8(cp, out);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown entity &", ref, ";"));
    }
    i = semi;
  }
  return out;
}

// ParseXml's state: the position in the document, the root and the open elements.
class XmlParser {
 public:
  explicit XmlParser(absl::string_view doc) : doc_(doc), n_(doc.size()) {}

  absl::StatusOr<std::unique_ptr<Element>> Parse() {
    if (Starts("<?xml")) {
      const size_t end = doc_.find("?>", i_);
      if (end == absl::string_view::npos) return absl::InvalidArgumentError("unterminated <?xml");
      i_ = end + 2;
    }
    while (i_ < n_) {
      absl::Status s;
      if (doc_[i_] != '<') {
        s = ParseText();
      } else if (Starts("<!--")) {
        s = SkipComment();
      } else if (Starts("<!") || Starts("<?")) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected markup at offset ", i_));
      } else if (Starts("</")) {
        s = ParseEndTag();
      } else {
        s = ParseStartTag();
      }
      if (!s.ok()) return s;
    }
    if (!stack_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("<", stack_.back()->name, "> is never closed"));
    }
    if (root_ == nullptr) return absl::InvalidArgumentError("no root element");
    return std::move(root_);
  }

 private:
  bool Starts(absl::string_view prefix) const { return doc_.substr(i_, prefix.size()) == prefix; }

  void SkipSpace() {
    while (i_ < n_ && std::isspace(static_cast<unsigned char>(doc_[i_]))) ++i_;
  }

  absl::StatusOr<std::string> ParseName() {
    if (i_ >= n_ || !IsNameStart(doc_[i_])) {
      return absl::InvalidArgumentError(absl::StrCat("expected a name at offset ", i_));
    }
    const size_t start = i_;
    while (i_ < n_ && IsNameChar(doc_[i_])) ++i_;
    return std::string(doc_.substr(start, i_ - start));
  }

  // Character data up to the next '<': the open element's text, or space outside the root.
  absl::Status ParseText() {
    const size_t end = std::min(doc_.find('<', i_), n_);
    absl::StatusOr<std::string> text = DecodeEntities(doc_.substr(i_, end - i_));
    if (!text.ok()) return text.status();
    if (stack_.empty()) {
      if (text->find_first_not_of(" \t\r\n") != std::string::npos) {
        return absl::InvalidArgumentError("character data outside the root element");
      }
    } else {
      stack_.back()->text += *text;
    }
    i_ = end;
    return absl::OkStatus();
  }

  absl::Status SkipComment() {
    const size_t end = doc_.find("-->", i_);
    if (end == absl::string_view::npos) {
      return absl::InvalidArgumentError("unterminated comment");
    }
    i_ = end + 3;
    return absl::OkStatus();
  }

  // At "</": closes the innermost open element, which must have this name.
  absl::Status ParseEndTag() {
    i_ += 2;
    absl::StatusOr<std::string> name = ParseName();
    if (!name.ok()) return name.status();
    SkipSpace();
    if (i_ >= n_ || doc_[i_] != '>') return absl::InvalidArgumentError("bad end tag");
    ++i_;
    if (stack_.empty() || stack_.back()->name != *name) {
      return absl::InvalidArgumentError(absl::StrCat("end tag </", *name, "> does not match <",
                                                     stack_.empty() ? "" : stack_.back()->name,
                                                     ">"));
    }
    stack_.pop_back();
    return absl::OkStatus();
  }

  // At '<' of a start tag: the element, with its attributes, under the open one (or as the
  // root); it stays open unless the tag ends in "/>".
  absl::Status ParseStartTag() {
    ++i_;  // '<'
    auto element = std::make_unique<Element>();
    absl::StatusOr<std::string> name = ParseName();
    if (!name.ok()) return name.status();
    element->name = *name;
    bool self_closing = false;
    while (true) {
      const size_t before = i_;
      SkipSpace();
      if (i_ >= n_) return absl::InvalidArgumentError("unterminated start tag");
      if (Starts("/>")) {
        self_closing = true;
        i_ += 2;
        break;
      }
      if (doc_[i_] == '>') {
        ++i_;
        break;
      }
      if (i_ == before) {
        return absl::InvalidArgumentError("attributes must be separated by space");
      }
      absl::Status s = ParseAttribute(*element);
      if (!s.ok()) return s;
    }
    Element* raw = element.get();
    if (stack_.empty()) {
      if (root_ != nullptr) return absl::InvalidArgumentError("more than one root element");
      root_ = std::move(element);
    } else {
      stack_.back()->children.push_back(std::move(element));
    }
    if (!self_closing) stack_.push_back(raw);
    return absl::OkStatus();
  }

  // At an attribute's name: name="value" (or 'value') into `element`.
  absl::Status ParseAttribute(Element& element) {
    absl::StatusOr<std::string> key = ParseName();
    if (!key.ok()) return key.status();
    SkipSpace();
    if (i_ >= n_ || doc_[i_] != '=') {
      return absl::InvalidArgumentError(absl::StrCat("attribute ", *key, " has no '='"));
    }
    ++i_;
    SkipSpace();
    if (i_ >= n_ || (doc_[i_] != '"' && doc_[i_] != '\'')) {
      return absl::InvalidArgumentError(absl::StrCat("attribute ", *key, " is not quoted"));
    }
    const char quote = doc_[i_++];
    const size_t end = doc_.find(quote, i_);
    if (end == absl::string_view::npos) {
      return absl::InvalidArgumentError("unterminated attribute value");
    }
    absl::StatusOr<std::string> value = DecodeEntities(doc_.substr(i_, end - i_));
    if (!value.ok()) return value.status();
    if (!element.attrs.emplace(*key, *value).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate attribute ", *key));
    }
    i_ = end + 1;
    return absl::OkStatus();
  }

  const absl::string_view doc_;
  const size_t n_;
  size_t i_ = 0;
  std::unique_ptr<Element> root_;
  std::vector<Element*> stack_;  // the open elements, innermost last
};

absl::StatusOr<std::unique_ptr<Element>> ParseXml(absl::string_view doc) {
  return XmlParser(doc).Parse();
}

// Every element below `root` (in document order) with this tag name and class.
std::vector<const Element*> FindAll(const Element& root, const std::string& name,
                                    const std::string& cls = "") {
  std::vector<const Element*> out;
  std::function<void(const Element&)> walk = [&](const Element& e) {
    if (e.name == name && (cls.empty() || e.Attr("class") == cls)) out.push_back(&e);
    for (const auto& c : e.children) walk(*c);
  };
  walk(root);
  return out;
}

double Num(const std::string& s) {
  double v = 0;
  EXPECT_TRUE(absl::SimpleAtod(s, &v)) << "not a number: " << s;
  return v;
}

std::vector<std::pair<double, double>> Points(const Element& polyline) {
  std::vector<std::pair<double, double>> out;
  for (absl::string_view p : absl::StrSplit(polyline.Attr("points"), ' ', absl::SkipEmpty())) {
    std::vector<std::string> xy = absl::StrSplit(p, ',');
    EXPECT_EQ(xy.size(), 2u) << p;
    if (xy.size() == 2) out.push_back({Num(xy[0]), Num(xy[1])});
  }
  return out;
}

struct Rect {
  double x, y, w, h;
};
Rect RectOf(const Element& e) {
  return {Num(e.Attr("x")), Num(e.Attr("y")), Num(e.Attr("width")), Num(e.Attr("height"))};
}

std::unique_ptr<Element> ParseOrDie(const std::string& svg) {
  absl::StatusOr<std::unique_ptr<Element>> doc = ParseXml(svg);
  EXPECT_TRUE(doc.ok()) << doc.status() << "\n" << svg;
  if (!doc.ok()) return std::make_unique<Element>();
  EXPECT_EQ((*doc)->name, "svg");
  return std::move(*doc);
}

// True when `step` is 1, 2 or 5 times a power of ten (to a relative 1e-9: the step
// comes back through decimal text).
bool IsOneTwoFive(double step) {
  if (!(step > 0)) return false;
  const double e = std::floor(std::log10(step) + 1e-12);
  const double m = step / std::pow(10.0, e);
  for (double nice : {1.0, 2.0, 5.0, 10.0}) {
    if (std::fabs(m - nice) < 1e-9 * nice) return true;
  }
  return false;
}

// ---- The checker itself ---------------------------------------------------------------

TEST(XmlCheckerTest, AcceptsWellFormedAndRejectsEachDefect) {
  EXPECT_TRUE(ParseXml("<?xml version=\"1.0\"?><a x=\"1\" y='2'><b/>t &amp; &lt;<c></c></a>").ok());
  EXPECT_FALSE(ParseXml("<a><b></a>").ok());           // b never closed
  EXPECT_FALSE(ParseXml("<a><b></c></a>").ok());       // mismatched end tag
  EXPECT_FALSE(ParseXml("<a>").ok());                  // root never closed
  EXPECT_FALSE(ParseXml("<a x=1></a>").ok());          // unquoted attribute
  EXPECT_FALSE(ParseXml("<a x=\"<\"></a>").ok());      // raw '<' in an attribute
  EXPECT_FALSE(ParseXml("<a>fish & chips</a>").ok());  // raw '&'
  EXPECT_FALSE(ParseXml("<a></a><b></b>").ok());       // two roots
  EXPECT_FALSE(ParseXml("<a x=\"1\"x=\"2\"></a>").ok());
}

// ---- Line chart -----------------------------------------------------------------------

LineChartOptions Options() {
  LineChartOptions o;
  o.title = "loss";
  o.x_label = "step";
  o.y_label = "nats/token";
  return o;
}

TEST(LineChartTest, WellFormedWithOnePolylinePerSeriesAndEveryPart) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<Series> series = {
      {"train", {{0, 4.0}, {1, 3.0}, {2, nan}, {3, 2.0}}},
      {"eval", {{0, 4.1}, {2, 2.5}}},
  };
  LineChartOptions options = Options();
  options.lines = {{"entropy floor", 1.5}};
  absl::StatusOr<std::string> svg = LineChart(series, options);
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  EXPECT_EQ(FindAll(*doc, "polyline", "series").size(), 2u);
  EXPECT_EQ(FindAll(*doc, "rect", "plot-area").size(), 1u);
  ASSERT_EQ(FindAll(*doc, "line", "reference-line").size(), 1u);
  EXPECT_EQ(FindAll(*doc, "line", "reference-line")[0]->Attr("stroke-dasharray"), "6,4");
  ASSERT_EQ(FindAll(*doc, "text", "reference-label").size(), 1u);
  EXPECT_EQ(FindAll(*doc, "text", "reference-label")[0]->text, "entropy floor");
  std::vector<const Element*> legend = FindAll(*doc, "text", "legend-label");
  ASSERT_EQ(legend.size(), 2u);
  EXPECT_EQ(legend[0]->text, "train");
  EXPECT_EQ(legend[1]->text, "eval");
  ASSERT_EQ(FindAll(*doc, "text", "title").size(), 1u);
  EXPECT_EQ(FindAll(*doc, "text", "title")[0]->text, "loss");
  EXPECT_EQ(FindAll(*doc, "text", "x-label")[0]->text, "step");
  EXPECT_EQ(FindAll(*doc, "text", "y-label")[0]->text, "nats/token");
  EXPECT_GE(FindAll(*doc, "text", "x-tick-label").size(), 3u);
  EXPECT_GE(FindAll(*doc, "text", "y-tick-label").size(), 3u);
  EXPECT_EQ(doc->Attr("width"), "800");
  EXPECT_EQ(doc->Attr("height"), "400");
}

TEST(LineChartTest, OnePointPerFinitePointInDataOrder) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // x goes forwards and then back, so order preservation (not sorting) is observable.
  std::vector<std::pair<double, double>> data = {
      {0, 1.0}, {1, 2.5}, {nan, 3.0}, {2, 2.0}, {3, inf}, {5, -1.0}, {4, 0.5}, {6, nan}, {7, 3.0}};
  std::vector<std::pair<double, double>> finite;
  for (auto [x, y] : data) {
    if (std::isfinite(x) && std::isfinite(y)) finite.push_back({x, y});
  }
  absl::StatusOr<std::string> svg = LineChart({{"s", data}}, Options());
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  std::vector<const Element*> lines = FindAll(*doc, "polyline", "series");
  ASSERT_EQ(lines.size(), 1u);
  std::vector<std::pair<double, double>> px = Points(*lines[0]);
  ASSERT_EQ(px.size(), finite.size());
  for (size_t i = 1; i < px.size(); ++i) {
    const double dx = finite[i].first - finite[i - 1].first;
    const double dy = finite[i].second - finite[i - 1].second;
    // x keeps the data's direction, y is flipped (SVG y grows downwards).
    EXPECT_EQ(dx > 0, px[i].first > px[i - 1].first) << "point " << i;
    EXPECT_EQ(dx < 0, px[i].first < px[i - 1].first) << "point " << i;
    EXPECT_EQ(dy > 0, px[i].second < px[i - 1].second) << "point " << i;
    EXPECT_EQ(dy<0, px[i].second> px[i - 1].second) << "point " << i;
  }
}

TEST(LineChartTest, ExtremePointsLieOnThePlotAreaEdges) {
  // Two series so the extremes come from different series.
  std::vector<Series> series = {
      {"a", {{-3.0, 10.0}, {2.0, 17.5}, {11.0, 12.0}}},
      {"b", {{0.5, 8.25}, {4.0, 9.0}}},
  };
  absl::StatusOr<std::string> svg = LineChart(series, Options());
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  const Rect area = RectOf(*FindAll(*doc, "rect", "plot-area")[0]);
  std::vector<const Element*> lines = FindAll(*doc, "polyline", "series");
  ASSERT_EQ(lines.size(), 2u);
  std::vector<std::pair<double, double>> a = Points(*lines[0]), b = Points(*lines[1]);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_NEAR(a[0].first, area.x, kPrintTolerance);            // min x = -3
  EXPECT_NEAR(a[2].first, area.x + area.w, kPrintTolerance);   // max x = 11
  EXPECT_NEAR(a[1].second, area.y, kPrintTolerance);           // max y = 17.5 at the top
  EXPECT_NEAR(b[0].second, area.y + area.h, kPrintTolerance);  // min y = 8.25 at the bottom
  // An interior point is placed linearly: x = 4 is 7/14 of the way across.
  EXPECT_NEAR(b[1].first, area.x + area.w * 7.0 / 14.0, kPrintTolerance);
}

TEST(LineChartTest, ReferenceLinesWidenTheRangeAndSitAtTheirValue) {
  LineChartOptions options = Options();
  options.lines = {{"floor", 1.0}};
  absl::StatusOr<std::string> svg = LineChart({{"s", {{0, 2.0}, {1, 3.0}}}}, options);
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  const Rect area = RectOf(*FindAll(*doc, "rect", "plot-area")[0]);
  const Element* line = FindAll(*doc, "line", "reference-line")[0];
  // The floor is the lowest value, so it is on the bottom edge; y = 2 is halfway up.
  EXPECT_NEAR(Num(line->Attr("y1")), area.y + area.h, kPrintTolerance);
  std::vector<std::pair<double, double>> p = Points(*FindAll(*doc, "polyline", "series")[0]);
  EXPECT_NEAR(p[0].second, area.y + area.h / 2, kPrintTolerance);
  // Its label is in the legend column, right of the plot, where it covers no data.
  const Element* label = FindAll(*doc, "text", "reference-label")[0];
  EXPECT_GT(Num(label->Attr("x")), area.x + area.w);
}

TEST(LineChartTest, EscapesMarkupInAllCallerText) {
  const std::string nasty = "a<b>&\"c\" 'd'";
  LineChartOptions options;
  options.title = nasty;
  options.x_label = nasty;
  options.y_label = nasty;
  options.lines = {{nasty, 1.0}};
  absl::StatusOr<std::string> svg = LineChart({{nasty, {{0, 0}, {1, 2}}}}, options);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(svg->find(nasty), std::string::npos);
  EXPECT_THAT(*svg, HasSubstr("a&lt;b&gt;&amp;&quot;c&quot; &#39;d&#39;"));
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  // Decoded, every piece of text reads as given.
  for (const char* cls : {"title", "x-label", "y-label", "reference-label", "legend-label"}) {
    std::vector<const Element*> e = FindAll(*doc, "text", cls);
    ASSERT_EQ(e.size(), 1u) << cls;
    EXPECT_EQ(e[0]->text, nasty) << cls;
  }
  EXPECT_EQ(FindAll(*doc, "polyline", "series")[0]->children[0]->text, nasty);
}

TEST(LineChartTest, ControlCharactersAndBadUtf8StayWellFormed) {
  const std::string weird = std::string("x\x01y\xff\xfez\n") + "\xC3\xA9";  // ends in "é"
  absl::StatusOr<std::string> svg = LineChart({{weird, {{0, 0}, {1, 1}}}}, Options());
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  EXPECT_EQ(FindAll(*doc, "text", "legend-label")[0]->text, "x?y??z \xC3\xA9");
}

TEST(LineChartTest, LongLegendNamesAreShortenedButKeptInTheTooltip) {
  const std::string long_name(300, 'n');
  absl::StatusOr<std::string> svg = LineChart({{long_name, {{0, 0}, {1, 1}}}}, Options());
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  const Element* label = FindAll(*doc, "text", "legend-label")[0];
  EXPECT_LT(label->text.size(), long_name.size());
  EXPECT_EQ(label->children[0]->text, long_name);
  // The plot keeps most of the width.
  EXPECT_GT(RectOf(*FindAll(*doc, "rect", "plot-area")[0]).w, 800 * 0.5);
}

// Parses the y tick labels and checks they form a 1-2-5 progression inside [lo, hi].
void ExpectNiceYTicks(const Element& doc, double lo, double hi) {
  std::vector<double> ticks;
  for (const Element* e : FindAll(doc, "text", "y-tick-label")) ticks.push_back(Num(e->text));
  ASSERT_GE(ticks.size(), 3u);
  ASSERT_LE(ticks.size(), 8u);
  const double step = ticks[1] - ticks[0];
  EXPECT_TRUE(IsOneTwoFive(step)) << step;
  for (size_t i = 0; i < ticks.size(); ++i) {
    // Labels are printed to the step's precision, so a relative 1e-9 of a step covers
    // the decimal round trip.
    EXPECT_NEAR(ticks[i], ticks[0] + i * step, step * 1e-9);
    const double k = ticks[i] / step;
    EXPECT_NEAR(k, std::round(k), 1e-9) << ticks[i] << " is not a multiple of " << step;
    EXPECT_GE(ticks[i], lo - step * 1e-9);
    EXPECT_LE(ticks[i], hi + step * 1e-9);
  }
}

TEST(LineChartTest, NiceTicksForAnAwkwardRange) {
  absl::StatusOr<std::string> svg = LineChart({{"s", {{0, 1.47}, {1, 4.2}}}}, Options());
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  ExpectNiceYTicks(*doc, 1.47, 4.2);
  for (const Element* e : FindAll(*doc, "text", "y-tick-label")) {
    const double v = Num(e->text);
    EXPECT_NEAR(std::remainder(v, 0.5), 0.0, 1e-9) << v;  // multiples of 0.5 (or 1)
  }
  // And on x too, for a range with a large offset.
  absl::StatusOr<std::string> svg2 = LineChart({{"s", {{1003, 0}, {1047, 1}}}}, Options());
  ASSERT_TRUE(svg2.ok()) << svg2.status();
  std::unique_ptr<Element> doc2 = ParseOrDie(*svg2);
  std::vector<const Element*> x = FindAll(*doc2, "text", "x-tick-label");
  ASSERT_GE(x.size(), 3u);
  for (const Element* e : x) {
    EXPECT_EQ(std::fmod(Num(e->text), 10.0), 0.0) << e->text;
    EXPECT_GE(Num(e->text), 1003);
    EXPECT_LE(Num(e->text), 1047);
  }
}

TEST(LineChartTest, SinglePointIsCentredAndVisible) {
  absl::StatusOr<std::string> svg = LineChart({{"s", {{5, 2}}}}, Options());
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  const Rect area = RectOf(*FindAll(*doc, "rect", "plot-area")[0]);
  std::vector<std::pair<double, double>> p = Points(*FindAll(*doc, "polyline", "series")[0]);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NEAR(p[0].first, area.x + area.w / 2, kPrintTolerance);
  EXPECT_NEAR(p[0].second, area.y + area.h / 2, kPrintTolerance);
  EXPECT_EQ(FindAll(*doc, "circle", "single-point").size(), 1u);
}

TEST(LineChartTest, ManySeriesGetDistinctColours) {
  std::vector<Series> series;
  for (int i = 0; i < 40; ++i) series.push_back({absl::StrCat("s", i), {{0, i}, {1, i + 1}}});
  absl::StatusOr<std::string> svg = LineChart(series, Options());
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  std::set<std::string> colours;
  for (const Element* e : FindAll(*doc, "polyline", "series")) colours.insert(e->Attr("stroke"));
  EXPECT_EQ(colours.size(), 40u);
}

TEST(LineChartTest, Errors) {
  LineChartOptions options = Options();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  absl::StatusOr<std::string> r = LineChart({}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("finite point"));
  r = LineChart({{"a", {}}, {"b", {{nan, 1}, {1, nan}}}}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("finite point"));

  const std::vector<Series> ok = {{"a", {{0, 0}, {1, 1}}}};
  options.width = 199;
  r = LineChart(ok, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("options.width"));
  options.width = 200;
  options.height = 149;
  r = LineChart(ok, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("options.height"));
  options.height = 150;
  EXPECT_TRUE(LineChart(ok, options).ok());  // the smallest size works

  options.lines = {{"floor", nan}};
  r = LineChart(ok, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("options.lines[0]"));
}

// ---- NiceTicks ------------------------------------------------------------------------

// Number of multiples of `step` in [lo, hi], counted the slow way.
int CountMultiples(double lo, double hi, double step) {
  int count = 0;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; ++k) ++count;
  return count;
}

TEST(NiceTicksTest, PicksTheOneTwoFiveStepWithTheCountClosestToTarget) {
  const std::vector<std::pair<double, double>> ranges = {
      {1.47, 4.2},          {0, 1},      {0, 7},         {-3, 11},      {1003, 1047},
      {0.000123, 0.000987}, {-1e6, 3e6}, {2.5, 2.50001}, {0, 123456789}};
  for (auto [lo, hi] : ranges) {
    absl::StatusOr<Ticks> t = NiceTicks(lo, hi);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(IsOneTwoFive(t->step)) << lo << ".." << hi << ": " << t->step;
    ASSERT_EQ(static_cast<int>(t->values.size()), CountMultiples(lo, hi, t->step));
    for (size_t i = 0; i < t->values.size(); ++i) {
      // Relative 1e-9 of a step: the promised slack at the ends, and the rounding of
      // k * step in doubles.
      EXPECT_GE(t->values[i], lo - t->step * 1e-9);
      EXPECT_LE(t->values[i], hi + t->step * 1e-9);
      EXPECT_NEAR(t->values[i] / t->step, std::round(t->values[i] / t->step), 1e-9);
    }
    // No other 1-2-5 step comes closer to 5 ticks.
    const int best = std::abs(static_cast<int>(t->values.size()) - 5);
    const int e = static_cast<int>(std::floor(std::log10(hi - lo)));
    for (int k = e - 4; k <= e + 2; ++k) {
      for (double m : {1.0, 2.0, 5.0}) {
        const double step = m * std::pow(10.0, k);
        const int count = CountMultiples(lo, hi, step);
        if (count == 0) continue;
        EXPECT_LE(best, std::abs(count - 5)) << lo << ".." << hi << " step " << step;
      }
    }
  }
  absl::StatusOr<Ticks> t = NiceTicks(1.47, 4.2);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(t->step, 0.5);
}

TEST(NiceTicksTest, RejectsBadRanges) {
  EXPECT_EQ(NiceTicks(2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NiceTicks(0, std::numeric_limits<double>::infinity()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NiceTicks(0, 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Grouped bar chart ----------------------------------------------------------------

constexpr double kKiB = 1024, kMiB = 1024 * kKiB, kGiB = 1024 * kMiB;

// Parses a bytes tick label ("0B", "512B", "1.5KiB", "3MiB", "2GiB") to bytes.
double ParseBytes(const std::string& label) {
  static const std::vector<std::pair<std::string, double>> kUnits = {
      {"KiB", kKiB}, {"MiB", kMiB}, {"GiB", kGiB}, {"TiB", kGiB * 1024}, {"B", 1}};
  for (const auto& [suffix, scale] : kUnits) {
    if (label.size() > suffix.size() &&
        label.compare(label.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string number = label.substr(0, label.size() - suffix.size());
      // No trailing zeros after a decimal point ("1.50MiB" or "3.0MiB" would be wrong).
      if (number.find('.') != std::string::npos) {
        EXPECT_NE(number.back(), '0') << label;
        EXPECT_NE(number.back(), '.') << label;
      }
      return Num(number) * scale;
    }
  }
  ADD_FAILURE() << "not a bytes label: " << label;
  return 0;
}

// Checks the bytes y tick labels: one unit, 1-2-5 steps in it, top tick on the top edge,
// each label at the height its value implies. Returns the unit seen.
std::string ExpectBytesTicks(const Element& doc, double max_value) {
  const Rect area = RectOf(*FindAll(doc, "rect", "plot-area")[0]);
  std::vector<const Element*> labels = FindAll(doc, "text", "y-tick-label");
  EXPECT_GE(labels.size(), 3u);
  if (labels.size() < 3) return "";
  EXPECT_EQ(labels[0]->text, "0B");
  std::string unit = labels[1]->text.substr(labels[1]->text.find_first_not_of("0123456789."));
  std::vector<double> bytes;
  for (const Element* e : labels) {
    bytes.push_back(ParseBytes(e->text));
    if (e != labels[0]) {
      EXPECT_THAT(e->text, ::testing::EndsWith(unit));
    }
  }
  const double top = bytes.back();
  EXPECT_GE(top, max_value);  // the axis covers the tallest bar
  // The label's baseline is 4 px below its tick (text.y = tick y + 4).
  EXPECT_NEAR(Num(labels.back()->Attr("y")) - 4, area.y, kPrintTolerance);
  for (size_t i = 0; i < labels.size(); ++i) {
    const double y = Num(labels[i]->Attr("y")) - 4;
    EXPECT_NEAR(y, area.y + area.h * (1 - bytes[i] / top), kPrintTolerance) << labels[i]->text;
  }
  const double unit_scale = ParseBytes("1" + unit);
  EXPECT_TRUE(IsOneTwoFive((bytes[1] - bytes[0]) / unit_scale)) << labels[1]->text;
  return unit;
}

TEST(GroupedBarChartTest, BytesTickLabelsInOneBinaryUnit) {
  struct Case {
    double max;
    std::string unit;
  };
  for (const Case& c : {Case{700, "B"}, Case{3.3 * kKiB, "KiB"}, Case{3 * kMiB, "MiB"},
                        // The axis top is 1.1x the tallest bar: 920MiB stays in MiB,
                        // 1000MiB moves to GiB.
                        Case{920 * kMiB, "MiB"}, Case{1000 * kMiB, "GiB"}, Case{2 * kGiB, "GiB"}}) {
    BarChartOptions options;
    options.bytes = true;
    absl::StatusOr<std::string> svg =
        GroupedBarChart({{"rank 0", {{"param", c.max}, {"grad", c.max / 3}}}}, options);
    ASSERT_TRUE(svg.ok()) << svg.status();
    std::unique_ptr<Element> doc = ParseOrDie(*svg);
    EXPECT_EQ(ExpectBytesTicks(*doc, c.max), c.unit) << c.max;
  }
  // A hand-worked axis: 1.5 MiB needs a top of 1.65 MiB; steps of 0.5 MiB give the 5
  // ticks 0B, 0.5MiB, 1MiB, 1.5MiB, 2MiB.
  BarChartOptions options;
  options.bytes = true;
  absl::StatusOr<std::string> svg = GroupedBarChart({{"r", {{"param", 1.5 * kMiB}}}}, options);
  ASSERT_TRUE(svg.ok());
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  std::vector<std::string> labels;
  for (const Element* e : FindAll(*doc, "text", "y-tick-label")) labels.push_back(e->text);
  EXPECT_EQ(labels, (std::vector<std::string>{"0B", "0.5MiB", "1MiB", "1.5MiB", "2MiB"}));
  EXPECT_EQ(FindAll(*doc, "text", "value-label")[0]->text, "1.50MiB");
}

TEST(GroupedBarChartTest, BarsShareColoursPerCategoryAndScaleWithValue) {
  std::vector<BarGroup> groups = {
      {"rank 0", {{"param", 4.0}, {"grad", 2.0}, {"optim", 8.0}}},
      {"rank 1", {{"grad", 1.0}, {"param", 3.0}}},  // other order, no optim
      {"rank 2", {{"comm", 5.0}}},                  // a category only here
  };
  BarChartOptions options;
  options.title = "peak memory";
  absl::StatusOr<std::string> svg = GroupedBarChart(groups, options);
  ASSERT_TRUE(svg.ok()) << svg.status();
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  const Rect area = RectOf(*FindAll(*doc, "rect", "plot-area")[0]);
  std::vector<const Element*> bars = FindAll(*doc, "rect", "bar");
  ASSERT_EQ(bars.size(), 6u);
  std::vector<std::pair<std::string, double>> expected;  // (category, value), in bar order
  for (const BarGroup& g : groups) {
    for (const auto& b : g.bars) expected.push_back(b);
  }
  std::map<std::string, std::string> colour_of;
  std::vector<double> x_by_category_rank0, x_by_category_rank1;
  double pixels_per_unit = -1;
  for (size_t i = 0; i < bars.size(); ++i) {
    const auto& [category, value] = expected[i];
    const std::string fill = bars[i]->Attr("fill");
    auto [it, inserted] = colour_of.emplace(category, fill);
    EXPECT_EQ(it->second, fill) << category;
    const Rect r = RectOf(*bars[i]);
    EXPECT_NEAR(r.y + r.h, area.y + area.h, kPrintTolerance);  // standing on the x axis
    EXPECT_GE(r.y, area.y - kPrintTolerance);                  // inside the plot
    if (pixels_per_unit < 0) pixels_per_unit = r.h / value;
    // Heights are printed to 0.005 px; relative to a value of >= 1 unit that is tiny.
    EXPECT_NEAR(r.h, value * pixels_per_unit, kPrintTolerance) << category;
  }
  std::set<std::string> distinct;
  for (const auto& [cat, fill] : colour_of) distinct.insert(fill);
  EXPECT_EQ(distinct.size(), 4u);
  // The same category sits at the same offset within each group's slot.
  const double slot = area.w / 3;
  const double param0 = RectOf(*bars[0]).x - area.x, param1 = RectOf(*bars[4]).x - area.x - slot;
  EXPECT_NEAR(param0, param1, kPrintTolerance);
  // Legend in first-appearance order, group labels in order, value labels per bar.
  std::vector<const Element*> legend = FindAll(*doc, "text", "legend-label");
  ASSERT_EQ(legend.size(), 4u);
  EXPECT_EQ(legend[0]->text, "param");
  EXPECT_EQ(legend[1]->text, "grad");
  EXPECT_EQ(legend[2]->text, "optim");
  EXPECT_EQ(legend[3]->text, "comm");
  std::vector<const Element*> group_labels = FindAll(*doc, "text", "group-label");
  ASSERT_EQ(group_labels.size(), 3u);
  EXPECT_EQ(group_labels[2]->text, "rank 2");
  std::vector<const Element*> values = FindAll(*doc, "text", "value-label");
  ASSERT_EQ(values.size(), 6u);
  EXPECT_EQ(values[2]->text, "8");
}

TEST(GroupedBarChartTest, EscapesNamesAndAllowsZero) {
  const std::string nasty = "<rank & \"0\">";
  absl::StatusOr<std::string> svg =
      GroupedBarChart({{nasty, {{nasty, 0.0}, {"b", 0.0}}}}, BarChartOptions());
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(svg->find(nasty), std::string::npos);
  std::unique_ptr<Element> doc = ParseOrDie(*svg);
  EXPECT_EQ(FindAll(*doc, "text", "group-label")[0]->text, nasty);
  EXPECT_EQ(FindAll(*doc, "text", "legend-label")[0]->text, nasty);
  for (const Element* bar : FindAll(*doc, "rect", "bar")) EXPECT_EQ(Num(bar->Attr("height")), 0);
}

TEST(GroupedBarChartTest, Errors) {
  BarChartOptions options;
  absl::StatusOr<std::string> r = GroupedBarChart({}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("groups"));
  r = GroupedBarChart({{"rank 0", {}}}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);

  r = GroupedBarChart({{"rank 0", {{"param", 1}}}, {"rank 1", {{"grad", -5}}}}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("rank 1"));
  EXPECT_THAT(r.status().message(), HasSubstr("grad"));
  r = GroupedBarChart({{"rank 0", {{"param", std::nan("")}}}}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("param"));
  r = GroupedBarChart({{"rank 0", {{"param", 1}, {"param", 2}}}}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("more than once"));

  options.width = 100;
  r = GroupedBarChart({{"rank 0", {{"param", 1}}}}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("options.width"));
  options.width = 800;
  options.height = 0;
  r = GroupedBarChart({{"rank 0", {{"param", 1}}}}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("options.height"));
}

// ---- WriteTextFile --------------------------------------------------------------------

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

TEST(WriteTextFileTest, RoundTripAndOverwriteLeaveNoTemporaryFiles) {
  std::string dir_template = TempDir() + "/write_text_file_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir_template.data()), nullptr);
  const std::string dir = dir_template;
  const std::string path = dir + "/chart.svg";
  absl::StatusOr<std::string> svg = LineChart({{"s", {{0, 1}, {1, 2}}}}, LineChartOptions());
  ASSERT_TRUE(svg.ok());
  ASSERT_TRUE(WriteTextFile(path, *svg).ok());
  EXPECT_EQ(ReadFile(path), *svg);
  const std::string other = std::string("second\0version", 14);
  ASSERT_TRUE(WriteTextFile(path, other).ok());
  EXPECT_EQ(ReadFile(path), other);
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"chart.svg"});
}

TEST(WriteTextFileTest, MissingDirectoryIsAnErrorNamingThePath) {
  const std::string path = TempDir() + "/no/such/dir/chart.svg";
  absl::Status s = WriteTextFile(path, "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_EQ(WriteTextFile("", "x").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace integration::charts
