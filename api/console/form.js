// A form generated from a tool's input JSON Schema: one field per property (text, number, checkbox, a select for an
// enum, JSON for objects and arrays), required ones marked. read() returns the arguments object or throws naming
// the field.
import { h } from "./dom.js";

let seq = 0;

/** schemaForm builds the fields of schema under a fieldset; it returns {el, read}. */
export function schemaForm(schema, legend) {
  const props = (schema && schema.properties) || {};
  const required = new Set((schema && schema.required) || []);
  const readers = [];
  const fields = Object.entries(props).map(([name, p]) => {
    const id = `f${++seq}-${name}`;
    const type = Array.isArray(p.type) ? p.type.find((t) => t !== "null") : p.type;
    const help = p.description ? h("small", { class: "help", id: `${id}-help` }, p.description) : null;
    const common = { id, name, "aria-describedby": help ? `${id}-help` : undefined, required: required.has(name) };
    let input;
    let read;
    if (Array.isArray(p.enum)) {
      input = h("select", common, required.has(name) ? null : h("option", { value: "" }, "—"),
        p.enum.map((v) => h("option", { value: JSON.stringify(v) }, String(v))));
      read = () => (input.value === "" ? undefined : JSON.parse(input.value));
    } else if (type === "boolean") {
      input = h("input", { ...common, type: "checkbox", required: false });
      read = () => (input.checked ? true : required.has(name) ? false : undefined);
    } else if (type === "integer" || type === "number") {
      input = h("input", { ...common, type: "number", step: type === "integer" ? 1 : "any", inputmode: "decimal" });
      read = () => (input.value === "" ? undefined : Number(input.value));
    } else if (type === "object" || type === "array" || !type) {
      input = h("textarea", { ...common, rows: 3, placeholder: type === "array" ? "[ … ] (JSON)" : "{ … } (JSON)" });
      read = () => {
        if (input.value.trim() === "") return undefined;
        try {
          return JSON.parse(input.value);
        } catch (e) {
          throw new Error(`${name}: not valid JSON (${e.message})`);
        }
      };
    } else {
      input = h("input", { ...common, type: "text", autocomplete: "off", spellcheck: false,
        placeholder: p.examples ? String(p.examples[0]) : p.pattern ? p.pattern : "" });
      read = () => (input.value === "" ? undefined : input.value);
    }
    readers.push([name, read]);
    return h("div", { class: "field" },
      h("label", { for: id }, name, required.has(name) ? h("span", { class: "req", "aria-hidden": "true" }, " *") : null,
        h("span", { class: "type" }, ` ${type || "json"}`)),
      input, help);
  });
  const el = h("fieldset", { class: "schema" }, h("legend", {}, legend),
    fields.length ? fields : h("p", { class: "muted" }, "This tool takes no arguments."));
  return {
    el,
    read() {
      const out = {};
      for (const [name, read] of readers) {
        const v = read();
        if (v === undefined) {
          if (required.has(name)) throw new Error(`${name} is required`);
          continue;
        }
        out[name] = v;
      }
      return out;
    },
  };
}
