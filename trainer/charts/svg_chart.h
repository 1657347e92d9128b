// Hand-written SVG 1.1 charts for the main job's report: a line chart (loss curves with
// reference lines such as the entropy floor) and a grouped bar chart (per-rank memory by
// tag). No external libraries; the output is one self-contained SVG document that
// browsers render directly.
//
//   integration::charts::Series loss{"train loss", {{0, 4.2}, {10, 3.1}, {20, 2.4}}};
//   integration::charts::LineChartOptions options;
//   options.title = "GPT loss";
//   options.x_label = "step";
//   options.y_label = "nats/token";
//   options.lines.push_back({"entropy floor", 1.47});
//   ASSIGN_OR_RETURN(std::string svg, integration::charts::LineChart({loss}, options));
//   RETURN_IF_ERROR(integration::charts::WriteTextFile("/tmp/loss.svg", svg));
//
//   integration::charts::BarGroup rank0{"rank 0", {{"param", 1 << 20}, {"grad", 1 << 19}}};
//   integration::charts::BarChartOptions bar_options;
//   bar_options.bytes = true;  // tick labels as 1.5KiB / 3MiB / 2GiB
//   ASSIGN_OR_RETURN(std::string bars,
//                    integration::charts::GroupedBarChart({rank0}, bar_options));
//
// Every piece of caller text (titles, labels, names) is escaped, so any string is safe.
// The document marks its parts with classes that tests and scripts may rely on:
// rect.plot-area, polyline.series (one per series with a finite point, in input order),
// line.reference-line / text.reference-label, text.x-tick-label / text.y-tick-label,
// rect.bar (groups in order, categories in first-appearance order within each group),
// text.value-label, text.group-label, g.legend.
#ifndef TRAINER_CHARTS_SVG_CHART_H_
#define TRAINER_CHARTS_SVG_CHART_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace integration::charts {

// One line of a line chart.
struct Series {
  std::string name;                               // legend text (escaped in the SVG)
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite points skipped
};

// A dashed horizontal reference line across the plot, e.g. the entropy floor.
struct HorizontalLine {
  std::string label;
  double y = 0;
};

struct LineChartOptions {
  std::string title, x_label, y_label;
  int width = 800, height = 400;      // pixels, >= 200 x 150 (and <= 20000 each)
  std::vector<HorizontalLine> lines;  // dashed reference lines
};

// One SVG document: axes with about 5 "nice" ticks (steps of 1, 2 or 5 times a power of
// ten) and labels, one polyline per series (points in input order, distinct colours),
// legend, title, dashed reference lines with labels.
// The plot area spans exactly the finite data's x range and the y range of the finite
// data together with the reference lines, so the extreme points lie on its edges; a
// degenerate range (one distinct value) is widened symmetrically around that value.
// A series without finite points keeps its legend entry but draws nothing; a series with
// a single finite point also gets a dot so that it is visible.
// InvalidArgument naming the option for a bad size or a non-finite reference line, and
// when no series has a finite point.
absl::StatusOr<std::string> LineChart(const std::vector<Series>& series,
                                      const LineChartOptions& options);

// One group of bars, e.g. one rank.
struct BarGroup {
  std::string label;                                 // "rank 0"
  std::vector<std::pair<std::string, double>> bars;  // (category, value), e.g. ("param", bytes)
};

struct BarChartOptions {
  std::string title, y_label;
  int width = 800, height = 400;  // pixels, >= 200 x 150 (and <= 20000 each)
  bool bytes = false;             // tick labels as 1.5KiB / 3MiB / 2GiB
};

// Grouped bar chart: one slot per group, in which each category (in order of first
// appearance over all groups) has a fixed position and a colour shared across groups; a
// group without some category leaves its position empty. Legend of categories, value
// labels above the bars, y axis from 0 to a nice tick at or above the largest value.
// InvalidArgument for a bad size, no groups, no bars at all, a negative or non-finite
// value or a category repeated within a group (naming the group and the category).
absl::StatusOr<std::string> GroupedBarChart(const std::vector<BarGroup>& groups,
                                            const BarChartOptions& options);

// core::WriteFileAtomically (core/text_file.h): writes `contents` to `path` through a
// temporary file in the same directory and a rename, so readers see either the old file
// or the complete new one, never half of it. Errors name the path (and the temporary
// file where that is the one that failed).
absl::Status WriteTextFile(const std::string& path, const std::string& contents);

// The tick positions an axis over [lo, hi] gets: every multiple of `step` inside the
// range (with a relative slack of 1e-9 of a step at both ends), where `step` is 1, 2 or
// 5 times 10^`exponent`, chosen so the tick count is closest to `target` (ties go to the
// larger step). A range with lo == hi is first widened as the charts widen it (by 10% of
// |lo| each way, or by 1 around 0). InvalidArgument when lo > hi, either is non-finite,
// or target < 2.
struct Ticks {
  double step = 0;
  int exponent = 0;
  std::vector<double> values;
};
absl::StatusOr<Ticks> NiceTicks(double lo, double hi, int target = 5);

}  // namespace integration::charts

#endif  // TRAINER_CHARTS_SVG_CHART_H_
