// Rendering one attention head's weights [Lq, Lk] as a heatmap: a PNG (8-bit RGB, via libpng)
// and, with token labels, an SVG. Used by `cpuattn heatmap`; a library of its own
// (cpuattn_heatmap) so that tests can render and inspect images without the binary.
//
// Layout of the PNG (x to the right, y down, in pixels):
//
//   +-------------------------+     +--+
//   | cell (0,0)  cell (0,1)  | gap |  |  <- colour bar: top = colour of `max`,
//   | ...                     |     |  |     bottom = colour of 0
//   | rows = queries,         |     |  |
//   | columns = keys          |     |  |
//   +-------------------------+     +--+
//
// Colours: viridis (perceptually uniform, readable in grey and by most colour-blind readers)
// from 0 to the matrix's largest finite value `max` (1 if that is not > 0). Values are clamped
// to [0, max] (so -inf and negatives get the bottom colour, +inf the top one); NaN cells are
// drawn in kNanColour (pure red, which viridis never produces). Background: white.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cpuattn::heatmap {

// Every failure of this module (bad option, image too large, I/O, libpng). The message does not
// start with "cpuattn: ".
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(const Rgb&, const Rgb&) = default;
};

inline constexpr Rgb kNanColour{255, 0, 0};
inline constexpr Rgb kBackground{255, 255, 255};

// The colour map at t in [0, 1] (clamped; NaN gives the bottom colour). viridis(0) and
// viridis(1) are exactly the first and last anchors, #440154 and #fde725.
Rgb viridis(double t);
// The anchors viridis() interpolates, bottom (0) to top (1), evenly spaced.
const std::vector<Rgb>& viridis_anchors();
// "#rrggbb".
std::string hex(Rgb c);

// A row-major float matrix: rows = queries, cols = keys.
struct Matrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<float> values;  // rows * cols
  float at(std::int64_t r, std::int64_t c) const {
    return values[static_cast<std::size_t>(r * cols + c)];
  }
};

// The top of the colour scale: the largest finite value, or 1 if there is none > 0.
float scale_max(const Matrix& m);
// The colour of value `v` on a scale from 0 to `max` (> 0); kNanColour for NaN.
Rgb colour_of(float v, float max);

struct Options {
  int cell = 0;  // pixels per cell (1..kMaxCell); 0 = auto_cell()
};

inline constexpr int kMaxCell = 256;
inline constexpr int kAutoCellCap = 64;                  // auto_cell() never exceeds this
inline constexpr int kMinBarHeight = 64;                 // the image is at least this tall
inline constexpr std::int64_t kMaxSide = 1'000'000;      // libpng's default read limit
inline constexpr std::int64_t kMaxPixels = 1LL << 27;    // 128 Mpx, 384 MiB of RGB
inline constexpr std::int64_t kMaxSvgCells = 1LL << 20;  // ~100 MB of SVG

// The automatic cell size: the larger side of the grid is about 640 px (so a square or wide
// matrix gives an image 400-800 px wide), at least 1 px and at most kAutoCellCap px per cell.
int auto_cell(std::int64_t rows, std::int64_t cols);

// Where everything goes in the PNG.
struct Layout {
  int cell = 0;
  int grid_width = 0, grid_height = 0;  // cols * cell, rows * cell; the grid is at (0, 0)
  int bar_x = 0, bar_width = 0;         // the colour bar: x in [bar_x, bar_x + bar_width)
  int bar_height = 0;                   // y in [0, bar_height)
  int width = 0, height = 0;            // the whole image
};
// Throws Error if the cell size is out of range or the image would exceed the limits above.
Layout layout(std::int64_t rows, std::int64_t cols, const Options& options);

// An 8-bit RGB image, row-major, 3 bytes per pixel.
struct Image {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;
  Rgb at(int x, int y) const {
    const std::size_t i = (static_cast<std::size_t>(y) * width + x) * 3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};

// The heatmap with its colour bar. Throws Error (see layout()) for an empty or too large matrix.
Image render(const Matrix& m, const Options& options = {});
// The PNG file's bytes (libpng, 8-bit RGB, non-interlaced, sRGB). Throws Error.
std::vector<unsigned char> encode_png(const Image& image);

// An SVG of the same heatmap: cells as <rect>s (with a <title> tooltip "row -> col: value"),
// row labels on the left, column labels on top rotated -60 degrees, a colour bar with ticks at
// 0, max/2 and max. An empty `row_labels` / `col_labels` labels that axis 0, 1, 2, ...; otherwise
// its size must be rows / cols (Error if not). Labels must be valid UTF-8 (see parse_labels).
// `title` becomes the SVG's <title>.
std::string render_svg(const Matrix& m, const std::vector<std::string>& row_labels,
                       const std::vector<std::string>& col_labels, const Options& options = {},
                       const std::string& title = "");

// `text` with &, <, >, " and ' replaced by XML entities.
std::string xml_escape(std::string_view text);

// Labels, one per line: '\n' or "\r\n" line ends, a final line end optional, a UTF-8 byte order
// mark at the start ignored. Every line is a label (an empty line is an empty label). Throws
// Error ("line N ...") for invalid UTF-8 or control characters other than tab, which XML cannot
// hold.
std::vector<std::string> parse_labels(std::string_view text);
// Labels files larger than this are refused (a label per token: 16 MiB is millions of tokens,
// more than any heatmap can show); /dev/zero or a huge file fails at once instead of filling
// memory.
inline constexpr std::size_t kMaxLabelsBytes = std::size_t{16} << 20;
// Reads the file at `path` (a regular file, at most kMaxLabelsBytes; opened without blocking so
// a FIFO is an error, not a hang) and parses it. Error messages start with "<path>: ".
std::vector<std::string> read_labels(const std::string& path);

// `png_path` with its extension replaced by ".svg" ("heat.png" -> "heat.svg", "a.b/heat" ->
// "a.b/heat.svg", ".hidden" -> ".hidden.svg").
std::string svg_path_for(const std::string& png_path);

// Writes `bytes` to `path` atomically: a temporary file in the same directory, then rename().
// On failure the temporary file is removed, `path` is left as it was, and Error ("<path>: ...")
// is thrown.
void write_file(const std::string& path, std::string_view bytes);
inline void write_file(const std::string& path, const std::vector<unsigned char>& bytes) {
  write_file(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace cpuattn::heatmap
