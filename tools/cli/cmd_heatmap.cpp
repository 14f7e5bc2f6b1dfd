// `cpuattn heatmap`: one head's attention weights as a PNG heatmap (and, with token labels, an
// SVG). The rendering is in heatmap.h; this file reads and checks the inputs. Everything is
// checked and rendered in memory before anything is written; the PNG and the SVG are then
// committed together (files.h), so a failed run writes neither.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "cpuattn/cpuattn.h"
#include "files.h"
#include "heatmap.h"
#include "npy.h"

namespace cpuattn::cli {
namespace {

struct HeatmapArgs {
  std::string weights, out, row_labels, col_labels;
  std::int64_t head = 0, batch = 0;
  int cell = 0;
  CLI::Option* head_opt = nullptr;
  CLI::Option* batch_opt = nullptr;
};

// Checks --head or --batch against the size of its axis.
std::int64_t pick(const char* option, std::int64_t index, std::int64_t size, const char* axis,
                  const char* axes, const std::string& what) {
  if (index < 0 || index >= size) {
    fail(std::string(option) + " " + std::to_string(index) + " is out of range: " + what + " has " +
         std::to_string(size) + " " + (size == 1 ? axis : axes) + " (valid: 0.." +
         std::to_string(size - 1) + ")");
  }
  return index;
}

// Reads a labels file and checks it has `expected` labels.
std::vector<std::string> load_labels(const char* option, const std::string& path,
                                     std::int64_t expected, const char* axis) {
  std::vector<std::string> labels;
  try {
    labels = heatmap::read_labels(path);
  } catch (const heatmap::Error& e) {
    fail(std::string(option) + ": " + e.what());
  }
  if (static_cast<std::int64_t>(labels.size()) != expected) {
    fail(std::string(option) + " file '" + path + "' has " + std::to_string(labels.size()) +
         " label" + (labels.size() == 1 ? "" : "s") + " (lines), but the weights have " + axis +
         " = " + std::to_string(expected) + "; give one label per line");
  }
  return labels;
}

void run(const HeatmapArgs& a) {
  const bool svg = !a.row_labels.empty() || !a.col_labels.empty();
  const std::string svg_path = svg ? heatmap::svg_path_for(a.out) : std::string();
  if (svg && svg_path == a.out) {
    fail("--out '" + files::display(a.out) +
         "' ends in .svg, which is where the SVG goes; name the PNG *.png");
  }
  check_files(
      {{"--out", a.out}, {"the SVG (from --out)", svg_path}},
      {{"--weights", a.weights}, {"--row-labels", a.row_labels}, {"--col-labels", a.col_labels}});

  // ---- The weights and the slice to draw.
  const std::string what = "W (" + a.weights + ")";
  npy::Array w = npy::read(a.weights);
  if (w.dtype != DType::f32 && w.dtype != DType::f64) {
    fail(what + " has dtype " + dtype_name(w.dtype) + "; expected float32 or float64");
  }
  const int rank = w.rank();
  const std::string shape = npy::shape_str(w.shape);
  if (rank < 2 || rank > 4) {
    fail(what + " has shape " + shape +
         "; expected rank 2 [Lq, Lk], 3 [H, Lq, Lk] or 4 [B, H, Lq, Lk]");
  }
  for (std::int64_t d : w.shape) {
    if (d < 1) fail(what + " has shape " + shape + "; every dimension must be at least 1");
  }
  if (a.batch_opt->count() > 0 && rank < 4) {
    fail("--batch given, but " + what + " has shape " + shape + " of rank " + std::to_string(rank) +
         ", which has no batch axis (only rank 4 [B, H, Lq, Lk] has)");
  }
  if (a.head_opt->count() > 0 && rank < 3) {
    fail("--head given, but " + what + " has shape " + shape +
         " of rank 2 [Lq, Lk], which has no head axis");
  }
  const std::int64_t B = rank == 4 ? w.shape[0] : 1;
  const std::int64_t H = rank >= 3 ? w.shape[rank - 3] : 1;
  const std::int64_t Lq = w.shape[rank - 2], Lk = w.shape[rank - 1];
  const std::int64_t b =
      pick("--batch", a.batch, B, "batch", "batches", what + " of shape " + shape);
  const std::int64_t h = pick("--head", a.head, H, "head", "heads", what + " of shape " + shape);

  std::vector<std::string> rows, cols;
  if (!a.row_labels.empty()) rows = load_labels("--row-labels", a.row_labels, Lq, "Lq (rows)");
  if (!a.col_labels.empty()) cols = load_labels("--col-labels", a.col_labels, Lk, "Lk (columns)");

  heatmap::Matrix m;
  m.rows = Lq;
  m.cols = Lk;
  m.values.resize(static_cast<std::size_t>(Lq * Lk));
  const std::size_t offset = static_cast<std::size_t>((b * H + h) * Lq * Lk);
  if (w.dtype == DType::f32) {
    std::memcpy(m.values.data(), w.data.data() + offset * sizeof(float),
                m.values.size() * sizeof(float));
  } else {
    for (std::size_t i = 0; i < m.values.size(); ++i) {
      double d;
      std::memcpy(&d, w.data.data() + (offset + i) * sizeof(double), sizeof d);
      m.values[i] = static_cast<float>(d);
    }
  }
  w = npy::Array();  // free the file's memory before rendering

  // ---- Render in memory.
  heatmap::Options opts;
  opts.cell = a.cell;
  heatmap::Layout layout;
  std::vector<unsigned char> png;
  std::string svg_text;
  try {
    layout = heatmap::layout(Lq, Lk, opts);
    png = heatmap::encode_png(heatmap::render(m, opts));
    if (svg) {
      std::string title = "Attention weights of " + a.weights;
      if (rank == 4) title += ", batch " + std::to_string(b);
      if (rank >= 3) title += ", head " + std::to_string(h);
      svg_text = heatmap::render_svg(m, rows, cols, opts, title);
    }
  } catch (const heatmap::Error& e) {
    fail(std::string(e.what()) + (a.cell > 1 ? "; try a smaller --cell" : ""));
  }

  // ---- Files: both staged, then committed together; an existing SVG is untouched if the PNG
  // cannot be written.
  files::OutputFiles outputs;
  if (svg) outputs.stage(svg_path, svg_text);
  outputs.stage(a.out, std::string_view(reinterpret_cast<const char*>(png.data()), png.size()));
  outputs.commit();
  char scale[32];
  std::snprintf(scale, sizeof scale, "%.4g", static_cast<double>(heatmap::scale_max(m)));
  std::printf("wrote %s (%d x %d px: %lld x %lld cells of %d px, colour scale 0 to %s)\n",
              files::display(a.out).c_str(), layout.width, layout.height,
              static_cast<long long>(Lq), static_cast<long long>(Lk), layout.cell, scale);
  if (svg) std::printf("wrote %s\n", files::display(svg_path).c_str());
}

}  // namespace

void add_heatmap_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<HeatmapArgs>();
  CLI::App* cmd = app.add_subcommand(
      "heatmap", "Draw one head's attention weights as a PNG heatmap (and an SVG with labels)");
  cmd->add_option("--weights", args->weights,
                  "Attention weights (.npy, float32 or float64): [Lq, Lk], [H, Lq, Lk] or "
                  "[B, H, Lq, Lk], e.g. from `cpuattn run --weights`")
      ->required()
      ->type_name("W.npy");
  cmd->add_option("--out", args->out,
                  "The PNG to write (8-bit RGB). Written atomically and only if the run succeeds")
      ->required()
      ->type_name("HEAT.png");
  args->head_opt =
      cmd->add_option("--head", args->head, "Head to draw (default 0); W must have a head axis")
          ->type_name("H");
  args->batch_opt = cmd->add_option("--batch", args->batch,
                                    "Batch to draw (default 0); W must be rank 4 [B, H, Lq, Lk]")
                        ->type_name("B");
  cmd->add_option("--row-labels", args->row_labels,
                  "Labels of the queries (rows), one per line (UTF-8), exactly Lq lines. With "
                  "--row-labels or --col-labels an SVG is also written: OUT with its extension "
                  "replaced by .svg")
      ->type_name("FILE");
  cmd->add_option("--col-labels", args->col_labels,
                  "Labels of the keys (columns), one per line (UTF-8), exactly Lk lines")
      ->type_name("FILE");
  cmd->add_option("--cell", args->cell,
                  "Pixels per weight in the PNG (default: the larger side of the grid is about "
                  "640 px, 1 to " +
                      std::to_string(heatmap::kAutoCellCap) + " px per cell)")
      ->check(CLI::Range(1, heatmap::kMaxCell))
      ->type_name("PIXELS");
  cmd->footer(
      "Rows are queries (top to bottom), columns are keys (left to right). Colours: viridis from "
      "0 (dark purple) to the head's largest weight (yellow), shown by the colour bar on the "
      "right; values outside that range are clamped and NaN cells are drawn pure red.\n"
      "With labels, the SVG (OUT with .svg for its extension, e.g. heat.png -> heat.svg) has the "
      "row labels on the left, the column labels on top, a tooltip per cell and a colour bar "
      "with ticks at 0, max/2 and max; an axis without labels is numbered 0, 1, 2, ...\n"
      "The paths written are printed on stdout.\n"
      "Exit status: 0 on success, 2 on bad input (message on stderr; nothing is written).\n"
      "Examples:\n"
      "  cpuattn run --q q.npy --k k.npy --v v.npy --out out.npy --weights w.npy\n"
      "  cpuattn heatmap --weights w.npy --out heat.png --head 3\n"
      "  cpuattn heatmap --weights w.npy --out heat.png --row-labels target.txt \\\n"
      "      --col-labels source.txt        # also writes heat.svg");
  cmd->callback([args, &exit_code] { guarded(exit_code, [&] { run(*args); }); });
}

}  // namespace cpuattn::cli
