#include "trainer/charts/svg_chart.h"

#include <stdio.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/status_macros.h"
#include "core/text_file.h"

namespace integration::charts {
namespace {

constexpr int kMinWidth = 200;
constexpr int kMinHeight = 150;
constexpr int kMaxSide = 20000;
// Rough advance of one character of the 11-12px sans-serif text used for labels; only
// used to size the legend and to shorten labels, never for anything a test measures.
constexpr double kCharWidth = 7.0;

// ---- Text ----------------------------------------------------------------------------

// Length in bytes of the valid UTF-8 sequence starting at s[i], or 0 if it is invalid.
size_t Utf8Length(absl::string_view s, size_t i) {
  const unsigned char c = s[i];
  size_t n;
  uint32_t min;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  uint32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const unsigned char d = s[i + k];
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// Splits `s` into code points; invalid bytes and control characters (not allowed in
// XML 1.0) become '?', tabs and newlines become spaces.
std::vector<std::string> CodePoints(absl::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8Length(s, i);
    if (n == 0) {
      out.push_back("?");
      ++i;
      continue;
    }
    const unsigned char c = s[i];
    if (n == 1 && (c == '\t' || c == '\n' || c == '\r')) {
      out.push_back(" ");
    } else if (n == 1 && (c < 0x20 || c == 0x7F)) {
      out.push_back("?");
    } else {
      out.push_back(std::string(s.substr(i, n)));
    }
    i += n;
  }
  return out;
}

// `s` as XML character data or attribute value, shortened to at most `max_chars` code
// points (the last one an ellipsis) when max_chars >= 1.
std::string Escape(absl::string_view s, int max_chars = -1) {
  std::vector<std::string> cps = CodePoints(s);
  if (max_chars >= 1 && static_cast<int>(cps.size()) > max_chars) {
    cps.resize(max_chars - 1);
    cps.push_back("\xE2\x80\xA6");  // U+2026 HORIZONTAL ELLIPSIS
  }
  std::string out;
  for (const std::string& cp : cps) {
    if (cp == "&")
      out += "&amp;";
    else if (cp == "<")
      out += "&lt;";
    else if (cp == ">")
      out += "&gt;";
    else if (cp == "\"")
      out += "&quot;";
    else if (cp == "'")
      out += "&#39;";
    else
      out += cp;
  }
  return out;
}

int NumCodePoints(absl::string_view s) { return static_cast<int>(CodePoints(s).size()); }

// A pixel coordinate.
std::string Px(double v) {
  std::string s = absl::StrFormat("%.2f", v);
  return s == "-0.00" ? "0.00" : s;
}

// ---- Colours --------------------------------------------------------------------------

// Tableau 10, then hues spaced by the golden angle for further series.
std::string Colour(int i) {
  static const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  constexpr int kNumPalette = sizeof(kPalette) / sizeof(kPalette[0]);
  if (i < kNumPalette) return kPalette[i];
  const double h = std::fmod((i - kNumPalette) * 137.508 + 15.0, 360.0) / 60.0;
  const double s = 0.65, l = 0.45;
  const double c = (1 - std::fabs(2 * l - 1)) * s;
  const double x = c * (1 - std::fabs(std::fmod(h, 2.0) - 1));
  double r = 0, g = 0, b = 0;
  switch (static_cast<int>(h)) {
    case 0:
      r = c;
      g = x;
      break;
    case 1:
      r = x;
      g = c;
      break;
    case 2:
      g = c;
      b = x;
      break;
    case 3:
      g = x;
      b = c;
      break;
    case 4:
      r = x;
      b = c;
      break;
    default:
      r = c;
      b = x;
      break;
  }
  const double m = l - c / 2;
  auto byte = [m](double v) { return static_cast<int>(std::lround((v + m) * 255)); };
  return absl::StrFormat("#%02x%02x%02x", byte(r), byte(g), byte(b));
}

// ---- Numbers and axes -----------------------------------------------------------------

double Pow10(int e) {
  double p = 1;
  for (int i = 0; i < std::abs(e); ++i) p *= 10;
  return e >= 0 ? p : 1 / p;
}

// k * m * 10^e computed so that short decimals come out as close as doubles allow.
double TickValue(int64_t k, int m, int e) {
  return e >= 0 ? static_cast<double>(k * m) * Pow10(e) : static_cast<double>(k * m) / Pow10(-e);
}

std::string TrimZeros(std::string s) {
  if (s.find('.') == std::string::npos) return s;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// A tick label for a value on an axis whose step is 1, 2 or 5 times 10^exponent.
std::string TickLabel(double v, int exponent) {
  std::string s;
  if (exponent >= 7 || exponent <= -5) {
    s = absl::StrFormat("%.3g", v);
  } else {
    s = absl::StrFormat("%.*f", std::max(0, -exponent), v);
  }
  if (s[0] == '-' && s.find_first_not_of("-0.") == std::string::npos) s.erase(0, 1);
  return s;
}

// A value as printed above a bar.
std::string ValueLabel(double v, bool bytes) {
  if (!bytes) return absl::StrFormat("%.4g", v);
  if (v < 1024) return absl::StrFormat("%.0fB", v);
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double scaled = v / 1024;
  int u = 0;
  while (scaled >= 1024 && u < 4) {
    scaled /= 1024;
    ++u;
  }
  return absl::StrFormat("%.2f%s", scaled, kUnits[u]);
}

// The data range of an axis, widened when it is a single value.
void WidenDegenerate(double& lo, double& hi) {
  if (hi > lo) return;
  const double half = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
  lo -= half;
  hi += half;
}

absl::Status CheckSize(absl::string_view chart, int width, int height) {
  if (width < kMinWidth || width > kMaxSide) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: options.width must be in [%d, %d] pixels, got %d", chart, kMinWidth, kMaxSide, width));
  }
  if (height < kMinHeight || height > kMaxSide) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: options.height must be in [%d, %d] pixels, got %d", chart, kMinHeight,
                        kMaxSide, height));
  }
  return absl::OkStatus();
}

void OpenDocument(std::string& svg, int width, int height, absl::string_view title) {
  absl::StrAppend(&svg, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"", width,
                  "\" height=\"", height, "\" viewBox=\"0 0 ", width, " ", height,
                  "\" font-family=\"sans-serif\" font-size=\"12\">\n");
  absl::StrAppend(&svg, "<title>", Escape(title), "</title>\n");
  absl::StrAppend(&svg, "<rect class=\"background\" x=\"0\" y=\"0\" width=\"", width,
                  "\" height=\"", height, "\" fill=\"#ffffff\"/>\n");
  absl::StrAppend(&svg, "<text class=\"title\" x=\"", Px(width / 2.0),
                  "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">",
                  Escape(title, static_cast<int>(width / 9.0)), "</text>\n");
}

// The legend's width for these names in a chart `width` wide, and the longest name
// (in code points) that fits it.
struct LegendLayout {
  double width = 0;
  int max_chars = 0;
};
LegendLayout PlanLegend(const std::vector<std::string>& names, int width) {
  constexpr double kSwatch = 28;  // swatch and gaps before the text
  const double max_width = width * 0.3;
  int longest = 1;
  for (const std::string& n : names) longest = std::max(longest, NumCodePoints(n));
  LegendLayout layout;
  layout.max_chars = std::max(4, static_cast<int>((max_width - kSwatch) / kCharWidth));
  layout.max_chars = std::min(layout.max_chars, longest);
  layout.width = kSwatch + layout.max_chars * kCharWidth;
  return layout;
}

// Legend entries at the right of the plot area, starting at (x, y).
void AppendLegend(std::string& svg, const std::vector<std::string>& names, double x, double y,
                  int max_chars, bool swatch_is_line) {
  svg += "<g class=\"legend\">\n";
  for (size_t i = 0; i < names.size(); ++i) {
    const double cy = y + 18.0 * i;
    const std::string colour = Colour(static_cast<int>(i));
    if (swatch_is_line) {
      absl::StrAppend(&svg, "<line x1=\"", Px(x), "\" y1=\"", Px(cy), "\" x2=\"", Px(x + 18),
                      "\" y2=\"", Px(cy), "\" stroke=\"", colour, "\" stroke-width=\"2.5\"/>\n");
    } else {
      absl::StrAppend(&svg, "<rect x=\"", Px(x + 4), "\" y=\"", Px(cy - 5),
                      "\" width=\"10\" height=\"10\" fill=\"", colour, "\"/>\n");
    }
    absl::StrAppend(&svg, "<text class=\"legend-label\" x=\"", Px(x + 24), "\" y=\"", Px(cy + 4),
                    "\">", Escape(names[i], max_chars), "<title>", Escape(names[i]),
                    "</title></text>\n");
  }
  svg += "</g>\n";
}

struct PlotArea {
  double left, top, right, bottom;
  double width() const { return right - left; }
  double height() const { return bottom - top; }
};

void AppendPlotArea(std::string& svg, const PlotArea& area) {
  absl::StrAppend(&svg, "<rect class=\"plot-area\" x=\"", Px(area.left), "\" y=\"", Px(area.top),
                  "\" width=\"", Px(area.width()), "\" height=\"", Px(area.height()),
                  "\" fill=\"none\" stroke=\"#333333\"/>\n");
}

// Y ticks (grid line plus label) for the values in `ticks` on [lo, hi].
// `labels[i]` is the text of tick `ticks.values[i]`.
void AppendYTicks(std::string& svg, const PlotArea& area, const Ticks& ticks, double lo, double hi,
                  const std::vector<std::string>& labels) {
  for (size_t i = 0; i < ticks.values.size(); ++i) {
    const double v = ticks.values[i];
    const double y = area.bottom - (v - lo) / (hi - lo) * area.height();
    absl::StrAppend(&svg, "<line class=\"y-grid\" x1=\"", Px(area.left), "\" y1=\"", Px(y),
                    "\" x2=\"", Px(area.right), "\" y2=\"", Px(y), "\" stroke=\"#e0e0e0\"/>\n");
    absl::StrAppend(&svg, "<text class=\"y-tick-label\" x=\"", Px(area.left - 6), "\" y=\"",
                    Px(y + 4), "\" text-anchor=\"end\">", Escape(labels[i]), "</text>\n");
  }
}

void AppendYLabel(std::string& svg, const PlotArea& area, absl::string_view label) {
  if (label.empty()) return;
  const double cy = (area.top + area.bottom) / 2;
  absl::StrAppend(&svg, "<text class=\"y-label\" x=\"16\" y=\"", Px(cy),
                  "\" text-anchor=\"middle\" transform=\"rotate(-90 16 ", Px(cy), ")\">",
                  Escape(label, static_cast<int>(area.height() / kCharWidth)), "</text>\n");
}

}  // namespace

// ---- Public helpers -------------------------------------------------------------------

absl::StatusOr<Ticks> NiceTicks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) {
    return absl::InvalidArgumentError(
        absl::StrFormat("NiceTicks: range [%g, %g] must be finite with lo <= hi", lo, hi));
  }
  if (target < 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("NiceTicks: target must be >= 2, got %d", target));
  }
  const double span = hi - lo;
  if (!std::isfinite(span)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("NiceTicks: range [%g, %g] is too wide to measure", lo, hi));
  }
  if (span == 0) WidenDegenerate(lo, hi);
  const int e0 = static_cast<int>(std::floor(std::log10((hi - lo) / target)));
  Ticks best;
  int64_t best_diff = std::numeric_limits<int64_t>::max();
  int best_m = 1;
  int64_t best_first = 0, best_count = 0;
  for (int e = e0 - 1; e <= e0 + 1; ++e) {
    for (int m : {1, 2, 5}) {
      const double step = m * Pow10(e);
      const double slack = step * 1e-9;
      const double first = std::ceil((lo - slack) / step);
      const double last = std::floor((hi + slack) / step);
      // Guard against steps that cannot count this range in int64 (they are far off
      // target anyway).
      if (!(std::fabs(first) < 4e18 && std::fabs(last) < 4e18)) continue;
      const int64_t count = static_cast<int64_t>(last) - static_cast<int64_t>(first) + 1;
      const int64_t diff = std::llabs(count - target);
      // Candidates come in increasing step order, so "<=" hands ties to the larger step.
      if (count >= 1 && diff <= best_diff) {
        best_diff = diff;
        best.step = step;
        best.exponent = e;
        best_m = m;
        best_first = static_cast<int64_t>(first);
        best_count = count;
      }
    }
  }
  if (best_count == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("NiceTicks: found no ticks for range [%g, %g]", lo, hi));
  }
  for (int64_t k = 0; k < best_count; ++k) {
    best.values.push_back(TickValue(best_first + k, best_m, best.exponent));
  }
  return best;
}

// ---- Line chart -----------------------------------------------------------------------

namespace {

// The data range a line chart shows.
struct DataRange {
  double x_lo, x_hi, y_lo, y_hi;
};

// The range of the series' finite points and the reference lines' y, each axis widened
// when it is a single value. InvalidArgument when no point is finite, a reference line's
// y is not, or a span overflows a double.
absl::StatusOr<DataRange> LineChartRange(const std::vector<Series>& series,
                                         const LineChartOptions& options) {
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  size_t finite_points = 0;
  for (const Series& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      ++finite_points;
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  }
  if (finite_points == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LineChart: no series has a finite point (%d series given)", series.size()));
  }
  for (size_t i = 0; i < options.lines.size(); ++i) {
    const double y = options.lines[i].y;
    if (!std::isfinite(y)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("LineChart: options.lines[%d] (\"%s\") has non-finite y %g", i,
                          options.lines[i].label, y));
    }
    y_lo = std::min(y_lo, y);
    y_hi = std::max(y_hi, y);
  }
  if (!std::isfinite(x_hi - x_lo) || !std::isfinite(y_hi - y_lo)) {
    return absl::InvalidArgumentError(
        "LineChart: the data range is too wide to draw (its span overflows a double)");
  }
  WidenDegenerate(x_lo, x_hi);
  WidenDegenerate(y_lo, y_hi);
  return DataRange{x_lo, x_hi, y_lo, y_hi};
}

// Where data coordinates land in the plot area.
struct LineScale {
  PlotArea area;
  DataRange range;
  double X(double x) const {
    return area.left + (x - range.x_lo) / (range.x_hi - range.x_lo) * area.width();
  }
  double Y(double y) const {
    return area.bottom - (y - range.y_lo) / (range.y_hi - range.y_lo) * area.height();
  }
};

// X ticks (tick mark plus label) below the plot area.
void AppendXTicks(std::string& svg, const LineScale& scale, const Ticks& ticks) {
  const PlotArea& area = scale.area;
  for (double v : ticks.values) {
    const double x = scale.X(v);
    absl::StrAppend(&svg, "<line class=\"x-tick\" x1=\"", Px(x), "\" y1=\"", Px(area.bottom),
                    "\" x2=\"", Px(x), "\" y2=\"", Px(area.bottom + 5),
                    "\" stroke=\"#333333\"/>\n");
    absl::StrAppend(&svg, "<text class=\"x-tick-label\" x=\"", Px(x), "\" y=\"",
                    Px(area.bottom + 18), "\" text-anchor=\"middle\">",
                    Escape(TickLabel(v, ticks.exponent)), "</text>\n");
  }
}

void AppendXLabel(std::string& svg, const PlotArea& area, absl::string_view label, int height) {
  if (label.empty()) return;
  absl::StrAppend(&svg, "<text class=\"x-label\" x=\"", Px((area.left + area.right) / 2), "\" y=\"",
                  Px(height - 10.0), "\" text-anchor=\"middle\">",
                  Escape(label, static_cast<int>(area.width() / kCharWidth)), "</text>\n");
}

// Reference lines are told apart by their dash pattern; their labels go in the legend
// column, where they cannot cover the data.
const char* DashPattern(size_t i) { return i == 0 ? "6,4" : (i == 1 ? "2,3" : "10,3,2,3"); }

void AppendReferenceLines(std::string& svg, const LineScale& scale,
                          const std::vector<HorizontalLine>& lines) {
  for (size_t i = 0; i < lines.size(); ++i) {
    const double y = scale.Y(lines[i].y);
    absl::StrAppend(&svg, "<line class=\"reference-line\" x1=\"", Px(scale.area.left), "\" y1=\"",
                    Px(y), "\" x2=\"", Px(scale.area.right), "\" y2=\"", Px(y),
                    "\" stroke=\"#555555\" stroke-width=\"1.5\" stroke-dasharray=\"",
                    DashPattern(i), "\"/>\n");
  }
}

// One polyline per series through its finite points (a dot too when there is only
// one); a series without any is left out.
void AppendSeries(std::string& svg, const std::vector<Series>& series, const LineScale& scale) {
  for (size_t i = 0; i < series.size(); ++i) {
    std::string points;
    int n = 0;
    double last_x = 0, last_y = 0;
    for (const auto& [x, y] : series[i].points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      last_x = scale.X(x);
      last_y = scale.Y(y);
      absl::StrAppend(&points, n == 0 ? "" : " ", Px(last_x), ",", Px(last_y));
      ++n;
    }
    if (n == 0) continue;
    const std::string colour = Colour(static_cast<int>(i));
    absl::StrAppend(&svg, "<polyline class=\"series\" fill=\"none\" stroke=\"", colour,
                    "\" stroke-width=\"2\" stroke-linejoin=\"round\" points=\"", points,
                    "\"><title>", Escape(series[i].name), "</title></polyline>\n");
    if (n == 1) {
      absl::StrAppend(&svg, "<circle class=\"single-point\" cx=\"", Px(last_x), "\" cy=\"",
                      Px(last_y), "\" r=\"3\" fill=\"", colour, "\"/>\n");
    }
  }
}

// The reference lines' legend entries, in the legend column from row `first_row` on.
void AppendReferenceLegend(std::string& svg, const std::vector<HorizontalLine>& lines,
                           const PlotArea& area, size_t first_row, int max_chars) {
  for (size_t i = 0; i < lines.size(); ++i) {
    const double x = area.right + 12;
    const double cy = area.top + 8 + 18.0 * (first_row + i);
    absl::StrAppend(
        &svg, "<line x1=\"", Px(x), "\" y1=\"", Px(cy), "\" x2=\"", Px(x + 18), "\" y2=\"", Px(cy),
        "\" stroke=\"#555555\" stroke-width=\"1.5\" stroke-dasharray=\"", DashPattern(i), "\"/>\n");
    absl::StrAppend(&svg, "<text class=\"reference-label\" x=\"", Px(x + 24), "\" y=\"", Px(cy + 4),
                    "\" fill=\"#555555\">", Escape(lines[i].label, max_chars), "<title>",
                    Escape(lines[i].label), "</title></text>\n");
  }
}

}  // namespace

absl::StatusOr<std::string> LineChart(const std::vector<Series>& series,
                                      const LineChartOptions& options) {
  RETURN_IF_ERROR(CheckSize("LineChart", options.width, options.height));
  ASSIGN_OR_RETURN(const DataRange range, LineChartRange(series, options));
  ASSIGN_OR_RETURN(const Ticks x_ticks, NiceTicks(range.x_lo, range.x_hi));
  ASSIGN_OR_RETURN(const Ticks y_ticks, NiceTicks(range.y_lo, range.y_hi));

  std::vector<std::string> names;
  for (const Series& s : series) names.push_back(s.name);
  std::vector<std::string> legend_names = names;
  for (const HorizontalLine& line : options.lines) legend_names.push_back(line.label);
  const LegendLayout legend = PlanLegend(legend_names, options.width);
  const LineScale scale{{70, 40, options.width - 16 - legend.width, options.height - 50.0}, range};
  const PlotArea& area = scale.area;

  std::string svg;
  OpenDocument(svg, options.width, options.height, options.title);
  std::vector<std::string> y_labels;
  for (double v : y_ticks.values) y_labels.push_back(TickLabel(v, y_ticks.exponent));
  AppendYTicks(svg, area, y_ticks, range.y_lo, range.y_hi, y_labels);
  AppendXTicks(svg, scale, x_ticks);
  AppendPlotArea(svg, area);
  AppendXLabel(svg, area, options.x_label, options.height);
  AppendYLabel(svg, area, options.y_label);
  AppendReferenceLines(svg, scale, options.lines);
  AppendSeries(svg, series, scale);
  AppendLegend(svg, names, area.right + 12, area.top + 8, legend.max_chars,
               /*swatch_is_line=*/true);
  AppendReferenceLegend(svg, options.lines, area, series.size(), legend.max_chars);
  svg += "</svg>\n";
  return svg;
}

// ---- Grouped bar chart ----------------------------------------------------------------

namespace {

// The categories of a bar chart's bars, in order of first appearance, and the largest
// value.
struct BarCategories {
  std::vector<std::string> names;
  double max_value = 0;
};

// InvalidArgument for no groups, no bars, a value that is not finite and >= 0, or a
// category twice in one group.
absl::StatusOr<BarCategories> CollectCategories(const std::vector<BarGroup>& groups) {
  if (groups.empty()) return absl::InvalidArgumentError("GroupedBarChart: groups is empty");
  BarCategories out;
  std::vector<std::string>& categories = out.names;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<std::string> seen;
    for (const auto& [category, value] : groups[g].bars) {
      if (!std::isfinite(value) || value < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "GroupedBarChart: groups[%d] (\"%s\") category \"%s\" has value %g; values "
            "must be finite and >= 0",
            g, groups[g].label, category, value));
      }
      if (std::find(seen.begin(), seen.end(), category) != seen.end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "GroupedBarChart: groups[%d] (\"%s\") has category \"%s\" more than once", g,
            groups[g].label, category));
      }
      seen.push_back(category);
      if (std::find(categories.begin(), categories.end(), category) == categories.end()) {
        categories.push_back(category);
      }
      out.max_value = std::max(out.max_value, value);
    }
  }
  if (categories.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GroupedBarChart: no group has a bar (%d groups given)", groups.size()));
  }
  return out;
}

// A bar chart's y axis: from 0 to `top`, ticks in data units with their labels.
struct BarAxis {
  Ticks ticks;
  std::vector<std::string> labels;
  double top = 0;
};

// The axis for bars up to `max_value`: it runs from 0 to the first tick at or above
// max_value * 1.1, leaving room for the value labels above the tallest bar. Byte axes
// pick their step in the unit of that top (B, KiB, MiB, ...) so the labels come out as
// 1.5KiB, 3MiB, ... in one unit.
absl::StatusOr<BarAxis> PlanBarAxis(double max_value, bool bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  const double wanted_top = max_value > 0 ? max_value * 1.1 : 1;
  int unit_index = 0;
  double unit = 1;
  if (bytes) {
    while (wanted_top >= unit * 1024 && unit_index < 5) {
      unit *= 1024;
      ++unit_index;
    }
  }
  double top = wanted_top / unit;
  ASSIGN_OR_RETURN(Ticks ticks, NiceTicks(0, top));
  if (bytes && unit_index == 0 && ticks.exponent < 0) {  // no fractional bytes
    top = std::max(top, 5.0);
    ASSIGN_OR_RETURN(ticks, NiceTicks(0, top));
  }
  const double step = ticks.step;
  top = std::ceil(top / step - 1e-9) * step;
  if (ticks.values.back() < top - step * 0.5) ticks.values.push_back(top);
  BarAxis axis;
  for (double v : ticks.values) {
    const std::string number = TickLabel(v, ticks.exponent);
    if (!bytes) {
      axis.labels.push_back(number);
    } else {
      axis.labels.push_back(v == 0 ? "0B" : absl::StrCat(TrimZeros(number), kUnits[unit_index]));
    }
  }
  axis.ticks = ticks;
  for (double& v : axis.ticks.values) v *= unit;
  axis.top = top * unit;
  return axis;
}

// A bar `width` wide with its top-left corner at (x, y) in colour `c`, with `title` (SVG
// text) as its tooltip and `label` above it.
void AppendBar(std::string& svg, double x, double y, double width, double height, int c,
               const std::string& title, const std::string& label) {
  absl::StrAppend(&svg, "<rect class=\"bar\" x=\"", Px(x), "\" y=\"", Px(y), "\" width=\"",
                  Px(width), "\" height=\"", Px(height), "\" fill=\"", Colour(c), "\"><title>",
                  title, "</title></rect>\n");
  const double cx = x + width / 2;
  if (width >= label.size() * 6.0) {
    absl::StrAppend(&svg, "<text class=\"value-label\" x=\"", Px(cx), "\" y=\"", Px(y - 3),
                    "\" text-anchor=\"middle\" font-size=\"10\">", Escape(label), "</text>\n");
  } else {  // too narrow: vertical, reading upwards from the bar's top
    absl::StrAppend(&svg, "<text class=\"value-label\" x=\"", Px(cx + 3), "\" y=\"", Px(y - 3),
                    "\" font-size=\"10\" transform=\"rotate(-90 ", Px(cx + 3), " ", Px(y - 3),
                    ")\">", Escape(label), "</text>\n");
  }
}

// Each group in its slot of the plot area, labelled below it: one bar per category it
// has, at that category's place, scaled to an axis from 0 to `y_hi`.
void AppendBarGroups(std::string& svg, const std::vector<BarGroup>& groups,
                     const std::vector<std::string>& categories, const PlotArea& area, double y_hi,
                     bool bytes) {
  const double slot = area.width() / groups.size();
  const double bar_slot = slot * 0.8 / categories.size();
  const double bar_width = bar_slot * 0.85;
  for (size_t g = 0; g < groups.size(); ++g) {
    const double slot_left = area.left + slot * g;
    absl::StrAppend(&svg, "<text class=\"group-label\" x=\"", Px(slot_left + slot / 2), "\" y=\"",
                    Px(area.bottom + 18), "\" text-anchor=\"middle\">",
                    Escape(groups[g].label, std::max(3, static_cast<int>(slot / kCharWidth))),
                    "</text>\n");
    for (const auto& [category, value] : groups[g].bars) {
      const int c = static_cast<int>(std::find(categories.begin(), categories.end(), category) -
                                     categories.begin());
      const double x = slot_left + slot * 0.1 + bar_slot * c + (bar_slot - bar_width) / 2;
      const double h = value / y_hi * area.height();
      const double y = area.bottom - h;
      const std::string label = ValueLabel(value, bytes);
      AppendBar(svg, x, y, bar_width, h, c,
                absl::StrCat(Escape(groups[g].label), " / ", Escape(category), ": ", Escape(label)),
                label);
    }
  }
}

}  // namespace

absl::StatusOr<std::string> GroupedBarChart(const std::vector<BarGroup>& groups,
                                            const BarChartOptions& options) {
  RETURN_IF_ERROR(CheckSize("GroupedBarChart", options.width, options.height));
  ASSIGN_OR_RETURN(const BarCategories categories, CollectCategories(groups));
  ASSIGN_OR_RETURN(const BarAxis axis, PlanBarAxis(categories.max_value, options.bytes));

  const LegendLayout legend = PlanLegend(categories.names, options.width);
  const PlotArea area{80, 40, options.width - 16 - legend.width, options.height - 50.0};
  std::string svg;
  OpenDocument(svg, options.width, options.height, options.title);
  AppendYTicks(svg, area, axis.ticks, 0, axis.top, axis.labels);
  AppendPlotArea(svg, area);
  AppendYLabel(svg, area, options.y_label);
  AppendBarGroups(svg, groups, categories.names, area, axis.top, options.bytes);
  AppendLegend(svg, categories.names, area.right + 12, area.top + 8, legend.max_chars,
               /*swatch_is_line=*/false);
  svg += "</svg>\n";
  return svg;
}

// ---- Files ----------------------------------------------------------------------------

absl::Status WriteTextFile(const std::string& path, const std::string& contents) {
  return core::WriteFileAtomically(path, contents);
}

}  // namespace integration::charts
