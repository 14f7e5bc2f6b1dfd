// heatmap::parse_labels on arbitrary bytes, against an independent statement of its contract:
// the labels are the lines (BOM stripped, '\n' or "\r\n" ends, final end optional), accepted iff
// every line is well-formed UTF-8 (Unicode Table 3-7) without C0 controls other than tab, DEL,
// U+FFFE or U+FFFF. Accepted labels then go through render_svg, whose output must be valid
// UTF-8 and well-formed XML in which every label reads back exactly (the XML escaping).
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "heatmap.h"

namespace hm = cpuattn::heatmap;

namespace {

// Length of the well-formed UTF-8 sequence at the start of `s` (Table 3-7), 0 if there is none.
std::size_t utf8_length(std::string_view s, std::uint32_t& cp) {
  auto at = [&](std::size_t i) { return i < s.size() ? static_cast<unsigned char>(s[i]) : 0x100; };
  auto in = [](unsigned v, unsigned lo, unsigned hi) { return v >= lo && v <= hi; };
  const unsigned b0 = at(0), b1 = at(1), b2 = at(2), b3 = at(3);
  std::size_t n = 0;
  if (b0 <= 0x7F)
    n = 1;
  else if (in(b0, 0xC2, 0xDF) && in(b1, 0x80, 0xBF))
    n = 2;
  else if (((b0 == 0xE0 && in(b1, 0xA0, 0xBF)) || (in(b0, 0xE1, 0xEC) && in(b1, 0x80, 0xBF)) ||
            (b0 == 0xED && in(b1, 0x80, 0x9F)) || (in(b0, 0xEE, 0xEF) && in(b1, 0x80, 0xBF))) &&
           in(b2, 0x80, 0xBF))
    n = 3;
  else if (((b0 == 0xF0 && in(b1, 0x90, 0xBF)) || (in(b0, 0xF1, 0xF3) && in(b1, 0x80, 0xBF)) ||
            (b0 == 0xF4 && in(b1, 0x80, 0x8F))) &&
           in(b2, 0x80, 0xBF) && in(b3, 0x80, 0xBF))
    n = 4;
  static const unsigned kLeadMask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  cp = n ? b0 & kLeadMask[n] : 0;
  for (std::size_t i = 1; i < n; ++i) cp = (cp << 6) | (at(i) & 0x3F);
  return n;
}

bool valid_text(std::string_view s, bool allow_controls) {
  for (std::size_t i = 0; i < s.size();) {
    std::uint32_t cp = 0;
    const std::size_t n = utf8_length(s.substr(i), cp);
    if (n == 0) return false;
    if (!allow_controls &&
        ((cp < 0x20 && cp != '\t') || cp == 0x7F || cp == 0xFFFE || cp == 0xFFFF)) {
      return false;
    }
    i += n;
  }
  return true;
}

// The lines of `text` as documented, before any validation.
std::vector<std::string> split_lines(std::string_view text) {
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
  std::vector<std::string> lines;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.ends_with('\r')) line.remove_suffix(1);
    lines.emplace_back(line);
  }
  return lines;
}

// A strict checker for the XML subset render_svg writes: a declaration, elements with
// double-quoted attributes, character data, and the five predefined entities (no comments, CDATA
// or other references). Returns the decoded text of every <text> and <title> element in order.
struct Xml {
  std::vector<std::string> texts, titles;
  std::string error;
};

class XmlChecker {
 public:
  explicit XmlChecker(std::string_view s) : s_(s) {}

  Xml run() {
    const std::string_view decl = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    if (!s_.starts_with(decl)) fail("no XML declaration");
    i_ = decl.size();
    while (x_.error.empty() && i_ < s_.size()) {
      if (s_[i_] != '<') {
        text();
        continue;
      }
      ++i_;
      const bool go_on = i_ < s_.size() && s_[i_] == '/' ? end_tag() : start_tag();
      if (!go_on) break;
    }
    if (x_.error.empty() && !open_.empty()) fail("unclosed element");
    if (x_.error.empty() && roots_ != 1) fail("no root element");
    return x_;
  }

 private:
  void fail(const char* why) {
    if (x_.error.empty()) x_.error = std::string(why) + " at byte " + std::to_string(i_);
  }

  // Decodes character data or an attribute value up to `stop`; '<' never occurs in either.
  void decode(char stop, std::string* out) {
    static const std::pair<std::string_view, char> kEntities[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    while (i_ < s_.size() && s_[i_] != stop) {
      if (s_[i_] == '<' || (stop == '<' && s_[i_] == '>'))
        return fail("unescaped markup character");
      if (s_[i_] != '&') {
        if (out) out->push_back(s_[i_]);
        ++i_;
        continue;
      }
      bool known = false;
      for (const auto& [entity, c] : kEntities) {
        if (s_.substr(i_).starts_with(entity)) {
          if (out) out->push_back(c);
          i_ += entity.size();
          known = true;
          break;
        }
      }
      if (!known) return fail("'&' that starts no predefined entity");
    }
  }

  std::string_view name() {
    const std::size_t start = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' ||
                              s_[i_] == ':' || s_[i_] == '_')) {
      ++i_;
    }
    if (i_ == start) fail("expected a name");
    return s_.substr(start, i_ - start);
  }

  // Character data, kept for the <text> or <title> element it is in.
  void text() {
    std::string t;
    decode('<', &t);
    if (open_.empty() && t.find_first_not_of(" \n") != std::string::npos)
      fail("text outside the root element");
    if (!open_.empty() && open_.back() == "text") x_.texts.back() += t;
    if (!open_.empty() && open_.back() == "title") x_.titles.back() += t;
  }

  // After "<": "/name>", closing the innermost open element. False on an error.
  bool end_tag() {
    ++i_;
    const std::string_view n = name();
    if (open_.empty() || open_.back() != n || i_ >= s_.size() || s_[i_] != '>') {
      fail("mismatched end tag");
      return false;
    }
    ++i_;
    open_.pop_back();
    return true;
  }

  // After "<": a name, attributes, then ">" (opening an element) or "/>". False on an error.
  bool start_tag() {
    const std::string_view n = name();
    if (open_.empty() && ++roots_ > 1) fail("a second root element");
    if (!attributes()) return false;
    if (s_[i_] == '/') {
      i_ += 2;  // empty-element tag
      return true;
    }
    ++i_;
    open_.push_back(n);
    if (n == "text") x_.texts.emplace_back();
    if (n == "title") x_.titles.emplace_back();
    return true;
  }

  // name="value" pairs up to the tag's ">" or "/>" (left unread). False on an error.
  bool attributes() {
    for (;;) {
      while (i_ < s_.size() && s_[i_] == ' ') ++i_;
      if (i_ >= s_.size() || !x_.error.empty()) return fail("unterminated tag"), false;
      if (s_[i_] == '>' || s_.substr(i_).starts_with("/>")) return true;
      name();
      if (!s_.substr(i_).starts_with("=\"")) return fail("attribute without =\"value\""), false;
      i_ += 2;
      decode('"', nullptr);
      if (i_ >= s_.size()) return fail("unterminated attribute value"), false;
      ++i_;
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
  int roots_ = 0;
  std::vector<std::string_view> open_;
  Xml x_;
};

Xml check_xml(std::string_view s) { return XmlChecker(s).run(); }

void check_svg(const std::vector<std::string>& labels) {
  // A small square matrix: rows labelled in order, columns in reverse, one NaN and one +inf cell
  // (their drawing paths), title = every label joined.
  hm::Matrix m;
  m.rows = m.cols = static_cast<std::int64_t>(labels.size());
  for (std::int64_t i = 0; i < m.rows * m.cols; ++i) m.values.push_back(0.25f * i);
  m.values.back() = std::numeric_limits<float>::quiet_NaN();
  if (m.values.size() > 1) m.values[1] = std::numeric_limits<float>::infinity();
  const std::vector<std::string> cols(labels.rbegin(), labels.rend());
  std::string title;
  for (const auto& l : labels) title += l + "|";
  const std::string svg = hm::render_svg(m, labels, cols, {}, title);

  FUZZ_CHECK(valid_text(svg, true), "render_svg wrote invalid UTF-8");
  const Xml x = check_xml(svg);
  FUZZ_CHECK(x.error.empty(), "render_svg wrote malformed XML: %s", x.error.c_str());
  // <text>: the row labels, the column labels, then the colour bar's ticks and NaN legend.
  FUZZ_CHECK(x.texts.size() >= 2 * labels.size(), "%zu <text> elements for %zu labels",
             x.texts.size(), labels.size());
  for (std::size_t r = 0; r < labels.size(); ++r) {
    FUZZ_CHECK(x.texts[r] == labels[r], "row label %zu reads back as '%s', not '%s'", r,
               x.texts[r].c_str(), labels[r].c_str());
    FUZZ_CHECK(x.texts[labels.size() + r] == cols[r], "column label %zu reads back as '%s'", r,
               x.texts[labels.size() + r].c_str());
  }
  // <title>: the document's, then one tooltip "row -> col: value" per cell.
  FUZZ_CHECK(x.titles.size() == 1 + labels.size() * labels.size() && x.titles[0] == title,
             "%zu <title> elements, first '%s'", x.titles.size(),
             x.titles.empty() ? "" : x.titles[0].c_str());
  for (std::size_t r = 0; r < labels.size(); ++r) {
    for (std::size_t c = 0; c < labels.size(); ++c) {
      const std::string& t = x.titles[1 + r * labels.size() + c];
      FUZZ_CHECK(t.starts_with(labels[r] + " \u2192 " + cols[c] + ": "),
                 "tooltip of cell (%zu, %zu) reads back as '%s'", r, c, t.c_str());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> lines = split_lines(text);
  bool valid = true;
  for (const auto& line : lines) valid = valid && valid_text(line, false);

  std::vector<std::string> labels;
  try {
    labels = hm::parse_labels(text);
  } catch (const hm::Error& e) {
    FUZZ_CHECK(!valid, "parse_labels rejected valid labels: %s", e.what());
    return 0;
  }
  FUZZ_CHECK(valid, "parse_labels accepted %zu labels, but a line is not valid", labels.size());
  FUZZ_CHECK(labels == lines, "parse_labels gave %zu labels, the lines are %zu", labels.size(),
             lines.size());
  // The SVG grows with labels^2; a few labels of modest length exercise the escaping as well.
  if (!labels.empty() && labels.size() <= 5 && size <= 2048) check_svg(labels);
  return 0;
}
