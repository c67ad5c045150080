/*
 * Build the snapshot viewer with rspack's API (the bundler @jupyter/builder brings): `node build-snapshot.js`.
 */
const { rspack } = require('@rspack/core');

const config = require('./snapshot.config.js')({}, { mode: process.argv.includes('--development') ? 'development' : 'production' });

rspack(config, (err, stats) => {
  if (err || stats.hasErrors()) {
    console.error(err ?? stats.toString({ colors: false, all: false, errors: true }));
    process.exit(1);
  }
  const asset = stats.toJson({ assets: true }).assets.find(a => a.name === config.output.filename);
  console.log(`snapshot viewer: ${config.output.path}/${config.output.filename} (${asset ? asset.size : '?'} bytes)`);
});
