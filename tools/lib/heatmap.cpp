// Heatmap rendering: see heatmap.h.
#include "heatmap.h"

#include <png.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>

#include "files.h"
#include "npy.h"

namespace cpuattn::heatmap {
namespace {

[[noreturn]] void fail(const std::string& message) { throw Error(message); }

std::string errno_text(int e) { return std::strerror(e); }

// ---- Colour map ----------------------------------------------------------------------------

// Viridis, by Stefan van der Walt, Nathaniel Smith and Eric Firing (CC0), as published in
// matplotlib's _cm_listed.py (`_viridis_data`, 256 sRGB float triples) and in the original
// https://github.com/BIDS/colormap/blob/master/colormaps.py. These 16 anchors are entries
// 0, 17, 34, ..., 255 of that table (every 17th, so evenly spaced), times 255 and rounded.
// Linear interpolation between them stays within 7/255 per channel of the full table (the
// largest gap is near the yellow end, where the blue channel dips and rises again).
const std::vector<Rgb> kViridis = {
    {68, 1, 84},     //   0: #440154
    {72, 26, 108},   //  17: #481a6c
    {71, 47, 125},   //  34: #472f7d
    {65, 68, 135},   //  51: #414487
    {57, 86, 140},   //  68: #39568c
    {49, 104, 142},  //  85: #31688e
    {42, 120, 142},  // 102: #2a788e
    {35, 136, 142},  // 119: #23888e
    {31, 152, 139},  // 136: #1f988b
    {34, 168, 132},  // 153: #22a884
    {53, 183, 121},  // 170: #35b779
    {84, 197, 104},  // 187: #54c568
    {122, 209, 81},  // 204: #7ad151
    {165, 219, 54},  // 221: #a5db36
    {210, 226, 27},  // 238: #d2e21b
    {253, 231, 37},  // 255: #fde725
};

std::uint8_t lerp(std::uint8_t a, std::uint8_t b, double f) {
  return static_cast<std::uint8_t>(std::lround(a + (b - a) * f));
}

// ---- Numbers and text ----------------------------------------------------------------------

// A number for the SVG: up to `digits` significant digits, no exponent for ordinary values.
std::string num(double v, int digits = 4) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

// Code points in valid UTF-8 text.
std::size_t code_points(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Whether [p, end) starts with a valid UTF-8 sequence; sets `len` and `cp`.
bool utf8_next(const unsigned char* p, const unsigned char* end, std::size_t& len,
               std::uint32_t& cp) {
  const unsigned char c = p[0];
  std::uint32_t min;
  if (c < 0x80) {
    len = 1;
    cp = c;
    return true;
  } else if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return false;
  }
  if (static_cast<std::size_t>(end - p) < len) return false;
  for (std::size_t i = 1; i < len; ++i) {
    if ((p[i] & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (p[i] & 0x3F);
  }
  return cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
}

// ---- PNG -----------------------------------------------------------------------------------

struct PngState {
  std::vector<unsigned char>* out = nullptr;
  char error[256] = {};  // libpng's message, or ours
};

// libpng calls these from C; nothing may throw through it. Errors longjmp back to encode_rows().
void on_png_error(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(state->error, sizeof state->error, "%s", message ? message : "unknown error");
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}

void on_png_write(png_structp png, png_bytep data, png_size_t size) {
  auto* state = static_cast<PngState*>(png_get_io_ptr(png));
  bool ok = true;
  try {
    state->out->insert(state->out->end(), data, data + size);
  } catch (...) {
    ok = false;
  }
  if (!ok) png_error(png, "out of memory");
}

void on_png_flush(png_structp) {}

// The part that may longjmp: only trivially destructible locals here.
bool encode_rows(png_structp png, png_infop info, const Image& image, PngState* state) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_write_fn(png, state, on_png_write, on_png_flush);
  png_set_IHDR(png, info, static_cast<png_uint_32>(image.width),
               static_cast<png_uint_32>(image.height), 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_set_sRGB(png, info, PNG_sRGB_INTENT_PERCEPTUAL);
  png_write_info(png, info);
  const std::size_t stride = static_cast<std::size_t>(image.width) * 3;
  for (int y = 0; y < image.height; ++y) {
    png_write_row(png, image.rgb.data() + static_cast<std::size_t>(y) * stride);
  }
  png_write_end(png, nullptr);
  return true;
}

}  // namespace

// ---- Colours -------------------------------------------------------------------------------

const std::vector<Rgb>& viridis_anchors() { return kViridis; }

Rgb viridis(double t) {
  if (!(t > 0)) return kViridis.front();  // also NaN
  if (t >= 1) return kViridis.back();
  const double x = t * static_cast<double>(kViridis.size() - 1);
  const auto i = static_cast<std::size_t>(x);
  const double f = x - static_cast<double>(i);
  const Rgb& a = kViridis[i];
  const Rgb& b = kViridis[std::min(i + 1, kViridis.size() - 1)];
  return {lerp(a.r, b.r, f), lerp(a.g, b.g, f), lerp(a.b, b.b, f)};
}

std::string hex(Rgb c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c.r, c.g, c.b);
  return buf;
}

float scale_max(const Matrix& m) {
  float mx = 0;
  for (float v : m.values) {
    if (std::isfinite(v) && v > mx) mx = v;
  }
  return mx > 0 ? mx : 1.0f;
}

Rgb colour_of(float v, float max) {
  if (std::isnan(v)) return kNanColour;
  if (v >= max) return kViridis.back();  // exactly the top colour for the largest value
  return viridis(static_cast<double>(v) / static_cast<double>(max));
}

// ---- PNG layout and rendering --------------------------------------------------------------

int auto_cell(std::int64_t rows, std::int64_t cols) {
  const std::int64_t side = std::max<std::int64_t>({rows, cols, 1});
  return static_cast<int>(std::clamp<std::int64_t>(640 / side, 1, kAutoCellCap));
}

Layout layout(std::int64_t rows, std::int64_t cols, const Options& options) {
  if (rows < 1 || cols < 1) {
    fail("cannot draw an empty matrix (" + std::to_string(rows) + " x " + std::to_string(cols) +
         ")");
  }
  if (options.cell < 0 || options.cell > kMaxCell) {
    fail("cell size " + std::to_string(options.cell) + " px is out of range 1.." +
         std::to_string(kMaxCell));
  }
  const int cell = options.cell > 0 ? options.cell : auto_cell(rows, cols);
  // rows, cols <= 2^63 / 256 is not guaranteed: check before multiplying.
  const std::int64_t limit = kMaxSide / cell + 1;
  const std::int64_t grid_w = cols <= limit ? cols * cell : kMaxSide + 1;
  const std::int64_t grid_h = rows <= limit ? rows * cell : kMaxSide + 1;
  const std::int64_t gap = std::clamp<std::int64_t>(grid_w / 40, 4, 16);
  const std::int64_t bar_w = std::clamp<std::int64_t>(grid_w / 20, 8, 32);
  const std::int64_t width = grid_w + gap + bar_w;
  const std::int64_t height = std::max<std::int64_t>(grid_h, kMinBarHeight);
  if (width > kMaxSide || height > kMaxSide || width * height > kMaxPixels) {
    fail("a " + std::to_string(rows) + " x " + std::to_string(cols) + " matrix with cells of " +
         std::to_string(cell) + " px needs an image of " +
         (width > kMaxSide ? "more than " + std::to_string(kMaxSide) : std::to_string(width)) +
         " x " +
         (height > kMaxSide ? "more than " + std::to_string(kMaxSide) : std::to_string(height)) +
         " px; the limit is " + std::to_string(kMaxSide) + " px a side and " +
         std::to_string(kMaxPixels) + " px in all");
  }
  Layout l;
  l.cell = cell;
  l.grid_width = static_cast<int>(grid_w);
  l.grid_height = static_cast<int>(grid_h);
  l.bar_x = static_cast<int>(grid_w + gap);
  l.bar_width = static_cast<int>(bar_w);
  l.bar_height = static_cast<int>(height);
  l.width = static_cast<int>(width);
  l.height = static_cast<int>(height);
  return l;
}

Image render(const Matrix& m, const Options& options) {
  if (static_cast<std::int64_t>(m.values.size()) != m.rows * m.cols) {
    fail("matrix of " + std::to_string(m.rows) + " x " + std::to_string(m.cols) + " has " +
         std::to_string(m.values.size()) + " values");
  }
  const Layout l = layout(m.rows, m.cols, options);
  Image img;
  img.width = l.width;
  img.height = l.height;
  const std::size_t stride = static_cast<std::size_t>(l.width) * 3;
  try {
    img.rgb.resize(stride * static_cast<std::size_t>(l.height));
  } catch (const std::bad_alloc&) {
    fail("out of memory for an image of " + std::to_string(l.width) + " x " +
         std::to_string(l.height) + " px");
  }
  auto put = [&](int x, int y, Rgb c) {
    std::uint8_t* p = img.rgb.data() + static_cast<std::size_t>(y) * stride + x * 3;
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  };
  for (int y = 0; y < l.height; ++y) {
    for (int x = 0; x < l.width; ++x) put(x, y, kBackground);
  }
  const float max = scale_max(m);
  for (std::int64_t r = 0; r < m.rows; ++r) {
    const int y0 = static_cast<int>(r * l.cell);
    for (std::int64_t c = 0; c < m.cols; ++c) {
      const Rgb colour = colour_of(m.at(r, c), max);
      const int x0 = static_cast<int>(c * l.cell);
      for (int y = y0; y < y0 + l.cell; ++y) {
        for (int x = x0; x < x0 + l.cell; ++x) put(x, y, colour);
      }
    }
  }
  for (int y = 0; y < l.bar_height; ++y) {
    const double t = l.bar_height > 1 ? 1.0 - static_cast<double>(y) / (l.bar_height - 1) : 1.0;
    const Rgb colour = viridis(t);
    for (int x = l.bar_x; x < l.bar_x + l.bar_width; ++x) put(x, y, colour);
  }
  return img;
}

std::vector<unsigned char> encode_png(const Image& image) {
  if (image.width < 1 || image.height < 1 ||
      image.rgb.size() != static_cast<std::size_t>(image.width) * image.height * 3) {
    fail("invalid image of " + std::to_string(image.width) + " x " + std::to_string(image.height) +
         " px");
  }
  std::vector<unsigned char> out;
  PngState state;
  state.out = &out;
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, &state, on_png_error, on_png_warning);
  if (!png) fail("libpng: cannot create a write struct (out of memory?)");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    fail("libpng: cannot create an info struct (out of memory?)");
  }
  const bool ok = encode_rows(png, info, image, &state);
  png_destroy_write_struct(&png, &info);
  if (!ok) fail(std::string("libpng: ") + state.error);
  return out;
}

// ---- SVG -----------------------------------------------------------------------------------

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_svg(const Matrix& m, const std::vector<std::string>& row_labels,
                       const std::vector<std::string>& col_labels, const Options& options,
                       const std::string& title) {
  if (m.rows < 1 || m.cols < 1 || static_cast<std::int64_t>(m.values.size()) != m.rows * m.cols) {
    fail("cannot draw a matrix of " + std::to_string(m.rows) + " x " + std::to_string(m.cols) +
         " with " + std::to_string(m.values.size()) + " values");
  }
  if (m.rows * m.cols > kMaxSvgCells) {
    fail("the SVG of a " + std::to_string(m.rows) + " x " + std::to_string(m.cols) +
         " matrix would have more than " + std::to_string(kMaxSvgCells) +
         " cells; labels are only readable on smaller matrices");
  }
  if (!row_labels.empty() && static_cast<std::int64_t>(row_labels.size()) != m.rows) {
    fail(std::to_string(row_labels.size()) + " row labels for " + std::to_string(m.rows) + " rows");
  }
  if (!col_labels.empty() && static_cast<std::int64_t>(col_labels.size()) != m.cols) {
    fail(std::to_string(col_labels.size()) + " column labels for " + std::to_string(m.cols) +
         " columns");
  }
  if (options.cell < 0 || options.cell > kMaxCell) {
    fail("cell size " + std::to_string(options.cell) + " px is out of range 1.." +
         std::to_string(kMaxCell));
  }
  auto label = [](const std::vector<std::string>& labels, std::int64_t i) {
    return labels.empty() ? std::to_string(i) : labels[static_cast<std::size_t>(i)];
  };

  // Geometry, in SVG user units (px). Text widths are estimated at 0.6 em per character.
  const int cell = std::max(options.cell > 0 ? options.cell : auto_cell(m.rows, m.cols), 16);
  const int font = std::clamp(cell / 2, 10, 14);
  const double char_w = 0.6 * font;
  const double pad = 8, label_gap = 6;
  const double cos60 = 0.5, sin60 = std::sqrt(3.0) / 2;
  double row_w = 0, col_up = 0;
  for (std::int64_t r = 0; r < m.rows; ++r) {
    row_w = std::max(row_w, char_w * static_cast<double>(code_points(label(row_labels, r))));
  }
  for (std::int64_t c = 0; c < m.cols; ++c) {
    col_up =
        std::max(col_up, sin60 * char_w * static_cast<double>(code_points(label(col_labels, c))));
  }
  const double left = std::ceil(pad + row_w + label_gap);
  const double top = std::ceil(pad + col_up + 0.5 * font + label_gap);
  const double grid_w = static_cast<double>(m.cols) * cell;
  const double grid_h = static_cast<double>(m.rows) * cell;
  const double bar_x = left + grid_w + std::max(12, cell / 2), bar_w = 16;
  const double bar_h = std::max(grid_h, 100.0);
  const float max = scale_max(m);
  const std::string ticks[3] = {"0", num(max / 2, 3), num(max, 3)};
  double tick_w = 0;
  for (const auto& t : ticks) tick_w = std::max(tick_w, char_w * static_cast<double>(t.size()));
  const bool any_nan =
      std::any_of(m.values.begin(), m.values.end(), [](float v) { return std::isnan(v); });
  // A column label starts at (x, top - label_gap) and runs up and to the right.
  const double col_dx = 0.3 * font;  // centres the rotated glyphs on the column
  double width = bar_x + bar_w + 7 + tick_w + pad;
  for (std::int64_t c = 0; c < m.cols; ++c) {
    const double x = left + (static_cast<double>(c) + 0.5) * cell + col_dx;
    width = std::max(width,
                     x + cos60 * char_w * static_cast<double>(code_points(label(col_labels, c))) +
                         0.5 * font + pad);
  }
  width = std::ceil(width);
  const double height =
      std::ceil(top + std::max(grid_h, bar_h + (any_nan ? 12.0 + 2 * font : 0.0)) + pad);

  std::ostringstream s;
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width, 10) << "\" height=\""
    << num(height, 10) << "\" viewBox=\"0 0 " << num(width, 10) << " " << num(height, 10)
    << "\" font-family=\"sans-serif\" font-size=\"" << font << "\">\n";
  if (!title.empty()) s << "<title>" << xml_escape(title) << "</title>\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"" << hex(kBackground) << "\"/>\n";
  // The colour bar's gradient: the anchors of the map, bottom (0) to top (max). SVG interpolates
  // linearly in sRGB, as viridis() does.
  s << "<defs><linearGradient id=\"colour-scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n";
  for (std::size_t i = 0; i < kViridis.size(); ++i) {
    s << "<stop offset=\"" << num(static_cast<double>(i) / (kViridis.size() - 1), 6)
      << "\" stop-color=\"" << hex(kViridis[i]) << "\"/>\n";
  }
  s << "</linearGradient></defs>\n";

  // Cells, each with a tooltip.
  s << "<g shape-rendering=\"crispEdges\">\n";
  for (std::int64_t r = 0; r < m.rows; ++r) {
    const std::string row = xml_escape(label(row_labels, r));
    for (std::int64_t c = 0; c < m.cols; ++c) {
      const float v = m.at(r, c);
      s << "<rect x=\"" << num(left + static_cast<double>(c) * cell, 10) << "\" y=\""
        << num(top + static_cast<double>(r) * cell, 10) << "\" width=\"" << cell << "\" height=\""
        << cell << "\" fill=\"" << hex(colour_of(v, max)) << "\"><title>" << row << " \u2192 "
        << xml_escape(label(col_labels, c)) << ": " << (std::isnan(v) ? std::string("NaN") : num(v))
        << "</title></rect>\n";
    }
  }
  s << "</g>\n";

  // Row labels, right-aligned against the grid.
  s << "<g text-anchor=\"end\">\n";
  for (std::int64_t r = 0; r < m.rows; ++r) {
    s << "<text x=\"" << num(left - label_gap, 10) << "\" y=\""
      << num(top + (static_cast<double>(r) + 0.5) * cell, 10) << "\" dy=\"0.35em\">"
      << xml_escape(label(row_labels, r)) << "</text>\n";
  }
  s << "</g>\n";

  // Column labels, rotated -60 degrees above the grid.
  s << "<g text-anchor=\"start\">\n";
  for (std::int64_t c = 0; c < m.cols; ++c) {
    const std::string x = num(left + (static_cast<double>(c) + 0.5) * cell + col_dx, 10);
    const std::string y = num(top - label_gap, 10);
    s << "<text x=\"" << x << "\" y=\"" << y << "\" transform=\"rotate(-60 " << x << " " << y
      << ")\">" << xml_escape(label(col_labels, c)) << "</text>\n";
  }
  s << "</g>\n";

  // Colour bar with ticks at 0, max/2 and max.
  s << "<rect x=\"" << num(bar_x, 10) << "\" y=\"" << num(top, 10) << "\" width=\"" << bar_w
    << "\" height=\"" << num(bar_h, 10)
    << "\" fill=\"url(#colour-scale)\" stroke=\"#808080\" stroke-width=\"0.5\"/>\n";
  for (int i = 0; i < 3; ++i) {
    const std::string y = num(top + bar_h * (1.0 - 0.5 * i), 10);
    s << "<line x1=\"" << num(bar_x + bar_w, 10) << "\" y1=\"" << y << "\" x2=\""
      << num(bar_x + bar_w + 4, 10) << "\" y2=\"" << y << "\" stroke=\"#000000\"/>\n"
      << "<text x=\"" << num(bar_x + bar_w + 7, 10) << "\" y=\"" << y << "\" dy=\"0.35em\">"
      << ticks[i] << "</text>\n";
  }
  if (any_nan) {
    const double y = top + bar_h + 12;
    s << "<rect x=\"" << num(bar_x, 10) << "\" y=\"" << num(y, 10) << "\" width=\"" << bar_w
      << "\" height=\"" << font << "\" fill=\"" << hex(kNanColour) << "\"/>\n"
      << "<text x=\"" << num(bar_x + bar_w + 7, 10) << "\" y=\"" << num(y + 0.5 * font, 10)
      << "\" dy=\"0.35em\">NaN</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

// ---- Labels --------------------------------------------------------------------------------

std::vector<std::string> parse_labels(std::string_view text) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  std::vector<std::string> labels;
  std::size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const auto* p = reinterpret_cast<const unsigned char*>(line.data());
    const auto* end = p + line.size();
    while (p < end) {
      std::size_t len = 0;
      std::uint32_t cp = 0;
      if (!utf8_next(p, end, len, cp)) {
        fail("line " + std::to_string(line_no) + " is not valid UTF-8 (byte " +
             std::to_string(p - reinterpret_cast<const unsigned char*>(line.data()) + 1) + ")");
      }
      if ((cp < 0x20 && cp != '\t') || cp == 0x7F || cp == 0xFFFE || cp == 0xFFFF) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(cp));
        fail("line " + std::to_string(line_no) + " contains the control character " + buf +
             ", which SVG (XML) cannot hold");
      }
      p += len;
    }
    labels.emplace_back(line);
  }
  return labels;
}

std::vector<std::string> read_labels(const std::string& path) {
  std::string text;
  try {
    const auto [fd, size] = files::open_input(path);
    try {
      if (size > kMaxLabelsBytes) {
        fail(files::display(path) + ": is " + std::to_string(size) +
             " bytes; a labels file may have at most " + std::to_string(kMaxLabelsBytes));
      }
      // Read what the size said plus one byte: a file that grows past the cap while it is read
      // (or lies about its size, as /proc files do) still stops at the cap.
      text.resize(size + 1);
      std::size_t got = 0;
      for (;;) {
        if (got == text.size()) {
          if (text.size() > kMaxLabelsBytes) {
            fail(files::display(path) + ": has more than " + std::to_string(kMaxLabelsBytes) +
                 " bytes; a labels file may have at most that");
          }
          text.resize(std::min(kMaxLabelsBytes + 1, 2 * text.size()));
        }
        const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail(files::display(path) + ": cannot read: " + errno_text(errno));
        if (n == 0) break;
        got += static_cast<std::size_t>(n);
      }
      text.resize(got);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  } catch (const files::Error& e) {
    fail(e.what());  // open_input's message names the path
  }
  try {
    return parse_labels(text);
  } catch (const Error& e) {
    fail(files::display(path) + ": " + e.what());
  }
}

// ---- Files ---------------------------------------------------------------------------------

std::string svg_path_for(const std::string& png_path) {
  const std::size_t slash = png_path.rfind('/');
  const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
  const std::size_t dot = png_path.rfind('.');
  if (dot == std::string::npos || dot <= base) return png_path + ".svg";
  return png_path.substr(0, dot) + ".svg";
}

void write_file(const std::string& path, std::string_view bytes) {
  try {
    npy::write_bytes(path, bytes);
  } catch (const npy::Error& e) {
    fail(e.what());
  }
}

}  // namespace cpuattn::heatmap
