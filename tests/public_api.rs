//! The deliberate public surface: `spec/public-api.txt` lists every public item of the `tenure`
//! library, and this test keeps that list identical to the code, so a new, renamed or removed
//! public item fails CI until the list is re-rendered (`TENURE_BLESS=1 cargo test --test
//! public_api`) and the diff is reviewed with the change.
//!
//! How the list is made (stable Rust has no rustdoc JSON, so the test reads the source): it parses
//! `src/lib.rs` and every module file it declares with `syn`, and walks the modules a user can
//! name, i.e. `pub` all the way from the crate root and not `#[doc(hidden)]`. In those it lists
//! every `pub` item that is not `#[doc(hidden)]`: functions, types, traits, constants, statics,
//! modules, the `pub` fields of structs, the variants of enums, the methods of traits and the
//! `pub` methods of inherent `impl` blocks (wherever in the crate the block is). A `pub use` of a
//! crate item is listed as `use PUBLIC = DEFINITION`, and when the definition sits in a private or
//! hidden module its fields, variants and methods are listed under the public name (that is the
//! only way a user reaches them). Items under `#[cfg(test)]` are left out; other `cfg`s are
//! printed after the item. What it does not list: trait impls (`impl Display for …`) and
//! signatures; a changed signature is reviewed as code, a new name is reviewed here.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use quote::ToTokens;
use syn::{Attribute, Fields, ImplItem, Item, TraitItem, UseTree, Visibility};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One module of the crate, as parsed.
#[derive(Default)]
struct Module {
    /// Declared `pub` (the crate root counts as public).
    public: bool,
    /// `#[doc(hidden)]` on the declaration or `#![doc(hidden)]` inside.
    hidden: bool,
    /// Names defined here: name → the definition.
    defs: BTreeMap<String, Def>,
    /// Names re-exported here with `pub use`: name → (target path, cfg suffix, hidden).
    uses: BTreeMap<String, (Vec<String>, String, bool)>,
    children: BTreeSet<String>,
}

struct Def {
    kind: &'static str,
    public: bool,
    hidden: bool,
    cfg: String,
    /// Fields, variants and trait methods, as (kind, suffix after the item's path).
    members: Vec<(&'static str, String)>,
}

/// A `pub` method of an inherent impl, keyed by the module and name of the type it is on.
struct Method {
    self_args: String,
    name: String,
    cfg: String,
}

#[derive(Default)]
struct Crate {
    modules: BTreeMap<Vec<String>, Module>,
    /// Inherent impl methods by (module the impl is in, type name).
    methods: Vec<(Vec<String>, String, Method)>,
}

fn is_hidden(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("doc")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string().trim() == "hidden")
    })
}

fn is_test_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string().trim() == "test")
    })
}

/// The item's `cfg` attributes, printed after it (` #[cfg(…)]`), or nothing.
fn cfg_suffix(attrs: &[Attribute]) -> String {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .map(|a| {
            let meta = tidy(&a.meta.to_token_stream().to_string());
            format!(" #[{}]", meta.replace(" (", "("))
        })
        .collect()
}

/// Token text without the spaces `proc_macro2` puts between every token.
fn tidy(s: &str) -> String {
    let mut out = s.to_string();
    for (from, to) in [
        (" < ", "<"),
        ("< ", "<"),
        (" <", "<"),
        (" >", ">"),
        (" ,", ","),
        (" :: ", "::"),
        (":: ", "::"),
        (" ::", "::"),
        ("( ", "("),
        (" )", ")"),
        ("& ", "&"),
        ("' ", "'"),
    ] {
        while out.contains(from) {
            out = out.replace(from, to);
        }
    }
    out
}

fn is_pub(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

impl Crate {
    fn load() -> Crate {
        let mut krate = Crate::default();
        let lib = root().join("src/lib.rs");
        let file = parse(&lib);
        let mut top = Module {
            public: true,
            hidden: is_hidden(&file.attrs),
            ..Module::default()
        };
        krate.walk(&mut top, &["tenure".to_string()], &file.items, &lib, true);
        krate.modules.insert(vec!["tenure".to_string()], top);
        krate
    }

    /// Reads the items of module `path`, declared in `file` (`is_dir_owner`: the file is
    /// lib.rs or mod.rs, so its child modules sit next to it).
    fn walk(
        &mut self,
        module: &mut Module,
        path: &[String],
        items: &[Item],
        file: &Path,
        is_dir_owner: bool,
    ) {
        for item in items {
            match item {
                Item::Mod(m) => {
                    if is_test_only(&m.attrs) {
                        continue;
                    }
                    let name = m.ident.to_string();
                    let mut child_path = path.to_vec();
                    child_path.push(name.clone());
                    let mut child = Module {
                        public: is_pub(&m.vis),
                        hidden: is_hidden(&m.attrs),
                        ..Module::default()
                    };
                    match &m.content {
                        Some((_, inner)) => {
                            let dir_file = file.with_extension("").join(format!("{name}.rs"));
                            self.walk(&mut child, &child_path, inner, &dir_file, false);
                        }
                        None => {
                            let dir = if is_dir_owner {
                                file.parent().unwrap().to_path_buf()
                            } else {
                                file.with_extension("")
                            };
                            let (child_file, owner) = locate(&dir, &name);
                            let parsed = parse(&child_file);
                            child.hidden |= is_hidden(&parsed.attrs);
                            self.walk(&mut child, &child_path, &parsed.items, &child_file, owner);
                        }
                    }
                    module.children.insert(name.clone());
                    module.defs.insert(
                        name,
                        Def {
                            kind: "mod",
                            public: is_pub(&m.vis),
                            hidden: is_hidden(&m.attrs),
                            cfg: cfg_suffix(&m.attrs),
                            members: Vec::new(),
                        },
                    );
                    self.modules.insert(child_path, child);
                }
                Item::Use(u) if is_pub(&u.vis) && !is_test_only(&u.attrs) => {
                    let mut leaves = Vec::new();
                    use_leaves(&u.tree, Vec::new(), &mut leaves);
                    for (name, target) in leaves {
                        module
                            .uses
                            .insert(name, (target, cfg_suffix(&u.attrs), is_hidden(&u.attrs)));
                    }
                }
                Item::Impl(i) if i.trait_.is_none() && !is_test_only(&i.attrs) => {
                    let syn::Type::Path(tp) = &*i.self_ty else {
                        continue;
                    };
                    let Some(last) = tp.path.segments.last() else {
                        continue;
                    };
                    let self_args = match &last.arguments {
                        syn::PathArguments::None => String::new(),
                        args => tidy(&args.to_token_stream().to_string()),
                    };
                    let impl_hidden = is_hidden(&i.attrs);
                    for ii in &i.items {
                        if let ImplItem::Fn(f) = ii
                            && is_pub(&f.vis)
                            && !impl_hidden
                            && !is_hidden(&f.attrs)
                            && !is_test_only(&f.attrs)
                        {
                            self.methods.push((
                                path.to_vec(),
                                last.ident.to_string(),
                                Method {
                                    self_args: self_args.clone(),
                                    name: f.sig.ident.to_string(),
                                    cfg: cfg_suffix(&i.attrs) + &cfg_suffix(&f.attrs),
                                },
                            ));
                        }
                    }
                }
                other => {
                    if let Some((name, def)) = definition(other) {
                        module.defs.insert(name, def);
                    }
                }
            }
        }
    }

    /// Follows re-exports from `module`'s name `name` to the defining module and name.
    fn resolve(
        &self,
        module: &[String],
        name: &str,
        depth: usize,
    ) -> Option<(Vec<String>, String)> {
        assert!(
            depth < 16,
            "re-export cycle at {}::{name}",
            module.join("::")
        );
        let m = self.modules.get(module)?;
        if m.defs.contains_key(name) {
            return Some((module.to_vec(), name.to_string()));
        }
        let (target, _, _) = m.uses.get(name)?;
        let (target_mod, target_name) = self.absolute(module, target)?;
        self.resolve(&target_mod, &target_name, depth + 1)
    }

    /// The crate module and name a `use` path names, or `None` for another crate's item.
    fn absolute(&self, module: &[String], target: &[String]) -> Option<(Vec<String>, String)> {
        let (last, init) = target.split_last()?;
        let mut at: Vec<String> = module.to_vec();
        for (i, seg) in init.iter().enumerate() {
            match seg.as_str() {
                "crate" if i == 0 => at = vec!["tenure".to_string()],
                "self" if i == 0 => {}
                "super" => {
                    at.pop();
                }
                _ => {
                    let known = self
                        .modules
                        .get(&at)
                        .is_some_and(|m| m.children.contains(seg));
                    if !known {
                        return None;
                    }
                    at.push(seg.clone());
                }
            }
        }
        Some((at, last.clone()))
    }

    /// A module a user can name: public from the root down, nothing hidden on the way.
    fn exported(&self, path: &[String]) -> bool {
        (1..=path.len()).all(|n| {
            self.modules
                .get(&path[..n])
                .is_some_and(|m| m.public && !m.hidden)
        })
    }

    /// The type a method's impl is on: the definition in the impl's module, or the one
    /// definition of that name in the crate.
    fn method_owner(&self, impl_mod: &[String], ty: &str) -> Option<(Vec<String>, String)> {
        if let Some(found) = self.resolve(impl_mod, ty, 0) {
            return Some(found);
        }
        let candidates: Vec<_> = self
            .modules
            .iter()
            .filter(|(_, m)| {
                m.defs
                    .get(ty)
                    .is_some_and(|d| d.kind != "mod" && d.kind != "fn")
            })
            .map(|(p, _)| p.clone())
            .collect();
        match candidates.as_slice() {
            [] => None,
            [one] => Some((one.clone(), ty.to_string())),
            many => panic!(
                "an impl of `{ty}` in {} matches several types ({many:?}): name the type with a \
                 path this test can follow (a `use` in that module)",
                impl_mod.join("::")
            ),
        }
    }

    fn render(&self) -> String {
        let mut lines = BTreeSet::new();
        // Definitions that a public path reaches: (module, name) → public paths.
        let mut reached: BTreeMap<(Vec<String>, String), Vec<String>> = BTreeMap::new();
        for (path, module) in &self.modules {
            if !self.exported(path) {
                continue;
            }
            let here = path.join("::");
            for (name, def) in &module.defs {
                if !def.public || def.hidden {
                    continue;
                }
                let public = format!("{here}::{name}");
                if def.kind == "mod" {
                    let mut child = path.clone();
                    child.push(name.clone());
                    if self.exported(&child) {
                        lines.insert(format!("mod {public}{}", def.cfg));
                    }
                    continue;
                }
                reached
                    .entry((path.clone(), name.clone()))
                    .or_default()
                    .push(public);
            }
            for (name, (target, cfg, hidden)) in &module.uses {
                if *hidden {
                    continue;
                }
                let public = format!("{here}::{name}");
                match self.absolute(path, target) {
                    None => {
                        lines.insert(format!("use {public} = {}{cfg}", target.join("::")));
                    }
                    Some((tmod, tname)) => {
                        let (dmod, dname) = self.resolve(&tmod, &tname, 0).unwrap_or_else(|| {
                            panic!("`pub use` {public} names nothing this test can find")
                        });
                        let definition = format!("{}::{dname}", dmod.join("::"));
                        lines.insert(format!("use {public} = {definition}{cfg}"));
                        let def = &self.modules[&dmod].defs[&dname];
                        if def.kind == "mod" {
                            continue;
                        }
                        // A definition a user already reaches under its own path is listed
                        // there; one in a private or hidden module is listed under this name.
                        if !(self.exported(&dmod) && def.public && !def.hidden) {
                            reached.entry((dmod, dname)).or_default().push(public);
                        }
                    }
                }
            }
        }
        for ((dmod, dname), publics) in &reached {
            let def = &self.modules[dmod].defs[dname];
            for public in publics {
                lines.insert(format!("{} {public}{}", def.kind, def.cfg));
                for (kind, suffix) in &def.members {
                    lines.insert(format!("{kind} {public}{suffix}"));
                }
            }
        }
        for (impl_mod, ty, method) in &self.methods {
            let Some(owner) = self.method_owner(impl_mod, ty) else {
                continue;
            };
            if let Some(publics) = reached.get(&owner) {
                for public in publics {
                    lines.insert(format!(
                        "fn {public}{}::{}{}",
                        method.self_args, method.name, method.cfg
                    ));
                }
            }
        }
        let mut out = String::from(
            "# The public items of the `tenure` library (rendered by tests/public_api.rs; do not edit:\n\
             # re-render with `TENURE_BLESS=1 cargo test --test public_api` and review the diff).\n",
        );
        for line in lines {
            writeln!(out, "{line}").unwrap();
        }
        out
    }
}

fn parse(file: &Path) -> syn::File {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("cannot parse {}: {e}", file.display()))
}

/// `dir/name.rs` (its children in `dir/name/`) or `dir/name/mod.rs` (children next to it).
fn locate(dir: &Path, name: &str) -> (PathBuf, bool) {
    let flat = dir.join(format!("{name}.rs"));
    if flat.exists() {
        return (flat, false);
    }
    let nested = dir.join(name).join("mod.rs");
    assert!(
        nested.exists(),
        "module {name}: neither {} nor {}",
        flat.display(),
        nested.display()
    );
    (nested, true)
}

/// The names a `use` tree brings in, with the path each one names.
fn use_leaves(tree: &UseTree, prefix: Vec<String>, out: &mut Vec<(String, Vec<String>)>) {
    match tree {
        UseTree::Path(p) => {
            let mut next = prefix;
            next.push(p.ident.to_string());
            use_leaves(&p.tree, next, out);
        }
        UseTree::Name(n) => {
            let mut target = prefix;
            target.push(n.ident.to_string());
            out.push((n.ident.to_string(), target));
        }
        UseTree::Rename(r) => {
            let mut target = prefix;
            target.push(r.ident.to_string());
            out.push((r.rename.to_string(), target));
        }
        UseTree::Glob(_) => {
            panic!("a `pub use …::*` hides what it exports: list the names (tests/public_api.rs)")
        }
        UseTree::Group(g) => {
            for t in &g.items {
                use_leaves(t, prefix.clone(), out);
            }
        }
    }
}

fn fields(fields: &Fields, prefix: &str, out: &mut Vec<(&'static str, String)>) {
    for (i, f) in fields.iter().enumerate() {
        if !is_pub(&f.vis) || is_hidden(&f.attrs) {
            continue;
        }
        let name = f
            .ident
            .as_ref()
            .map_or_else(|| i.to_string(), ToString::to_string);
        out.push(("field", format!("{prefix}.{name}{}", cfg_suffix(&f.attrs))));
    }
}

/// The name and description of a non-module, non-use, non-impl item.
fn definition(item: &Item) -> Option<(String, Def)> {
    let def = |kind, vis: &Visibility, attrs: &[Attribute], members| Def {
        kind,
        public: is_pub(vis),
        hidden: is_hidden(attrs),
        cfg: cfg_suffix(attrs),
        members,
    };
    let (name, d) = match item {
        Item::Fn(f) if !is_test_only(&f.attrs) => (
            f.sig.ident.to_string(),
            def("fn", &f.vis, &f.attrs, Vec::new()),
        ),
        Item::Struct(s) if !is_test_only(&s.attrs) => {
            let mut members = Vec::new();
            fields(&s.fields, "", &mut members);
            (
                s.ident.to_string(),
                def("struct", &s.vis, &s.attrs, members),
            )
        }
        Item::Enum(e) if !is_test_only(&e.attrs) => {
            let mut members = Vec::new();
            for v in &e.variants {
                if is_hidden(&v.attrs) {
                    continue;
                }
                members.push(("variant", format!("::{}{}", v.ident, cfg_suffix(&v.attrs))));
                fields(&v.fields, &format!("::{}", v.ident), &mut members);
            }
            (e.ident.to_string(), def("enum", &e.vis, &e.attrs, members))
        }
        Item::Trait(t) if !is_test_only(&t.attrs) => {
            let members = t
                .items
                .iter()
                .filter_map(|ti| match ti {
                    TraitItem::Fn(f) if !is_hidden(&f.attrs) => {
                        Some(("fn", format!("::{}", f.sig.ident)))
                    }
                    TraitItem::Type(ty) if !is_hidden(&ty.attrs) => {
                        Some(("type", format!("::{}", ty.ident)))
                    }
                    TraitItem::Const(c) if !is_hidden(&c.attrs) => {
                        Some(("const", format!("::{}", c.ident)))
                    }
                    _ => None,
                })
                .collect();
            (t.ident.to_string(), def("trait", &t.vis, &t.attrs, members))
        }
        Item::Type(t) if !is_test_only(&t.attrs) => (
            t.ident.to_string(),
            def("type", &t.vis, &t.attrs, Vec::new()),
        ),
        Item::Const(c) if !is_test_only(&c.attrs) => (
            c.ident.to_string(),
            def("const", &c.vis, &c.attrs, Vec::new()),
        ),
        Item::Static(s) if !is_test_only(&s.attrs) => (
            s.ident.to_string(),
            def("static", &s.vis, &s.attrs, Vec::new()),
        ),
        Item::Union(u) if !is_test_only(&u.attrs) => (
            u.ident.to_string(),
            def("union", &u.vis, &u.attrs, Vec::new()),
        ),
        Item::Macro(m) if m.attrs.iter().any(|a| a.path().is_ident("macro_export")) => {
            let name = m.ident.as_ref()?.to_string();
            let vis = Visibility::Public(Default::default());
            (name, def("macro", &vis, &m.attrs, Vec::new()))
        }
        _ => return None,
    };
    Some((name, d))
}

/// spec/public-api.txt is exactly the rendered list: a new public item is reviewed, not
/// accidental.
#[test]
fn public_api_txt_lists_every_public_item() {
    let rendered = Crate::load().render();
    let path = root().join("spec/public-api.txt");
    if std::env::var_os("TENURE_BLESS").is_some() {
        std::fs::write(&path, &rendered).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != rendered {
        let old: BTreeSet<&str> = on_disk.lines().collect();
        let new: BTreeSet<&str> = rendered.lines().collect();
        let mut diff = String::new();
        for l in new.difference(&old) {
            writeln!(diff, "+ {l}").unwrap();
        }
        for l in old.difference(&new) {
            writeln!(diff, "- {l}").unwrap();
        }
        panic!(
            "the public surface differs from spec/public-api.txt (+ in the code, - only in the \
             list):\n{diff}\nif the change is intended, run `TENURE_BLESS=1 cargo test --test \
             public_api` and commit the list with it; otherwise make the item private or \
             `#[doc(hidden)]`"
        );
    }
}

/// The walker itself: a `pub` item in an exported module is listed, a hidden or private one is
/// not, and a re-export out of a private module lists the definition's members under the public
/// name. Checked on the real crate, so a walker that lists nothing cannot pass.
#[test]
fn the_walker_sees_what_a_user_sees() {
    let rendered = Crate::load().render();
    for expected in [
        "mod tenure::machine",
        "struct tenure::Tenure",
        "use tenure::Tenure = tenure::typestate::Tenure",
        "fn tenure::Tenure<Cold>::open",
        "struct tenure::host::Host",
        "use tenure::Host = tenure::host::Host",
        "enum tenure::TenureError",
        "fn tenure::driver::run",
    ] {
        assert!(
            rendered.lines().any(|l| l == expected),
            "`{expected}` missing from the rendered list:\n{rendered}"
        );
    }
    for absent in [
        "mod tenure::privfs",
        "mod tenure::failpoint",
        "mod tenure::sync",
        "mod tenure::driver::core",
        "fn tenure::lease::cgroup::",
        "tenure::hex",
    ] {
        assert!(
            !rendered.lines().any(|l| l.starts_with(absent)),
            "`{absent}` is hidden or private, yet listed:\n{rendered}"
        );
    }
}
