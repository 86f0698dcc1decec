// A small latency chart (SVG, no library): one row of bars per histogram of /metrics.

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  return el;
}

function label(seconds) {
  return seconds < 1 ? `${Math.round(seconds * 1000)}ms` : `${seconds}s`;
}

// The upper bound of the bucket holding quantile q (as Prometheus' histogram_quantile, roughly).
export function quantile(histogram, q) {
  if (!histogram.count) return null;
  const rank = q * histogram.count;
  const index = histogram.cumulative.findIndex((c) => c >= rank);
  return index < 0 ? Infinity : histogram.bounds_s[index];
}

export function latencyChart(histogram) {
  const counts = histogram.cumulative.map((c, i) => c - (i ? histogram.cumulative[i - 1] : 0));
  counts.push(histogram.count - (histogram.cumulative.at(-1) || 0));
  const labels = [...histogram.bounds_s.map(label), "+Inf"];
  const width = 420;
  const height = 96;
  const bar = width / counts.length;
  const top = Math.max(1, ...counts);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height + 16}`, class: "chart",
    role: "img", "aria-label": `${histogram.name} distribution` });
  counts.forEach((count, i) => {
    const tall = Math.max(count ? 2 : 0, (count / top) * (height - 14));
    const rect = svg("rect", { x: i * bar + 2, y: height - tall, width: bar - 4, height: tall,
      rx: 2, class: "chart-bar" });
    const title = svg("title");
    title.textContent = `≤ ${labels[i]}: ${count} jobs`;
    rect.append(title);
    chart.append(rect);
    if (count) {
      const value = svg("text", { x: i * bar + bar / 2, y: height - tall - 3,
        class: "chart-value", "text-anchor": "middle" });
      value.textContent = String(count);
      chart.append(value);
    }
    if (i % 2 === 0) {
      const tick = svg("text", { x: i * bar + bar / 2, y: height + 12, class: "chart-tick",
        "text-anchor": "middle" });
      tick.textContent = labels[i];
      chart.append(tick);
    }
  });
  return chart;
}
