'use strict';
// coda-shim's install script: makes each command of this package (`bin/<name>`, where npm's links point) the
// native binary of this platform's package itself, so that running a command starts no Node and no shell.
//
// Before this runs (or where install scripts are off: `--ignore-scripts`, pnpm and bun by default),
// `bin/<name>` is a POSIX sh script that finds the same binary and execs it (same process, no Node).
// This script never fails the install: when the platform's package is missing or its binary does not run,
// it says so and leaves the sh script, which says the same each time the command is run.

const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');

const self = require('./package.json');
const platform = `${process.platform}-${process.arch}`;
const name = `@coda-shim/${platform}`;

function warn(lines) {
  process.stderr.write(lines.map((l) => `coda-shim: ${l}\n`).join(''));
}

function platformDir() {
  if (!Object.prototype.hasOwnProperty.call(self.optionalDependencies, name)) {
    warn([
      `no binaries for this platform (${platform}); there are packages for ` +
        Object.keys(self.optionalDependencies).map((n) => n.replace('@coda-shim/', '')).join(', '),
      'build it from source instead: cargo install --locked --git <repository URL> coda-shim',
    ]);
    return null;
  }
  let manifest;
  try {
    manifest = require.resolve(`${name}/package.json`);
  } catch (e) {
    warn([
      `the package ${name} (this platform's binaries, ${platform}) is not installed.`,
      'npm installs it with coda-shim unless optional dependencies are left out (--omit=optional,',
      '--no-optional, omit=optional in .npmrc, a package-lock.json made on another platform);',
      'install coda-shim again with them (npm install -g coda-shim)',
    ]);
    return null;
  }
  const version = require(manifest).version;
  if (version !== self.version) {
    warn([`${name} is version ${version}, coda-shim is ${self.version}: install again with npm install -g coda-shim`]);
    return null;
  }
  return path.dirname(manifest);
}

function link(command, dir) {
  const binary = path.join(dir, 'bin', command);
  const target = path.join(__dirname, 'bin', command);
  let answer;
  try {
    answer = execFileSync(binary, ['--version'], { encoding: 'utf8', timeout: 20000, stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    warn([`${binary} does not run here (${e.message.split('\n')[0]}); leaving the sh launcher in ${target}`]);
    return;
  }
  const first = answer.split('\n')[0];
  if (first !== `${command} ${self.version}`) {
    warn([`${binary} --version printed "${first}", not "${command} ${self.version}"; leaving the sh launcher`]);
    return;
  }
  // A hard link where the file system allows (no second copy), else a copy; then renamed over the launcher,
  // so the command is never missing or half written.
  const temporary = path.join(__dirname, 'bin', `.${command}.${process.pid}`);
  fs.rmSync(temporary, { force: true });
  try {
    fs.linkSync(binary, temporary);
  } catch (e) {
    fs.copyFileSync(binary, temporary);
  }
  fs.chmodSync(temporary, 0o755);
  fs.renameSync(temporary, target);
}

const dir = platformDir();
if (dir !== null) {
  for (const command of Object.keys(self.bin)) {
    link(command, dir);
  }
}
